"""The dataset catalogue: synthetic JPEG corpus, image folder, random tensors."""
