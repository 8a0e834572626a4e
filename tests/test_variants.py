"""Variant generation: exactly which variants, in which order, and only legal moves."""

from conftest import compose_spec

from pipebench.explore.variants import Chain, crop_first, explore, short_name

TV = "torchvision.transforms"
MASK = "pipebench.transforms.mask"
COLOR = "pipebench.transforms.color"


def _names(nodes):
    return [short_name(n) for n in nodes]


def _chain(*targets, per_batch=()):
    return Chain(tuple({"_target_": t, **({"size": 8} if "Crop" in t else {})} for t in targets),
                 tuple({"_target_": t} for t in per_batch))


def test_seed_chain_variants_in_order():
    spec = compose_spec(["transform=yuv_mask"])
    found = explore("yuv_mask", Chain(spec.per_sample, spec.per_batch))
    assert [v.name for v in found.variants] == [
        "yuv_mask", "yuv_mask+crop_first", "yuv_mask+fast", "yuv_mask+per_batch", "yuv_mask+crop_first+fast",
        "yuv_mask+crop_first+per_batch", "yuv_mask+fast+per_batch", "yuv_mask+crop_first+fast+per_batch"]
    assert found.not_applied == ("reduced_decode: the first step, PILToTensor, does not resize the image down "
                                 "(declares no draft_form)", "tensor_path: no step runs on the PIL image before "
                                 "PILToTensor (the decoder move covers it)")
    full = found.variants[-1]
    assert full.moves == ("crop_first", "fast", "per_batch")
    assert _names(full.chain.per_sample) == ["RandomCrop", "PILToTensor", "FastRandomMask"]
    assert _names(full.chain.per_batch) == ["BatchConvertColor", "BatchScale"]
    assert full.changes == ("move RandomCrop ahead of PILToTensor", "replace RandomMask with FastRandomMask",
                            "run ConvertColor once per batch as BatchConvertColor",
                            "run Scale once per batch as BatchScale")
    assert full.chain.per_sample[0] == {"_target_": f"{TV}.RandomCrop", "size": 256}, "arguments travel"
    assert full.chain.per_sample[2] == {"_target_": f"{MASK}.FastRandomMask", "ratio": 0.25}
    assert full.draws_per_batch == (), "ConvertColor and Scale are deterministic"
    # The catalogue's hand-written steps 2 and 3 are among the variants, chain for chain.
    for config, name in (("yuv_mask_fast", "yuv_mask+fast"), ("yuv_mask_crop_first", "yuv_mask+crop_first+fast")):
        hand = compose_spec([f"transform={config}"])
        assert next(v for v in found.variants if v.name == name).chain == Chain(hand.per_sample, hand.per_batch)


def test_crop_stops_at_a_neighbourhood_op():
    moved = crop_first(_chain(f"{TV}.PILToTensor", f"{COLOR}.Scale", f"{MASK}.RandomMask", f"{TV}.RandomCrop"))
    assert moved.changes == ()
    assert "RandomCrop cannot move ahead of RandomMask, which is not pointwise" in moved.reason


def test_crop_moves_past_pointwise_steps_and_conversion_but_not_past_undeclared():
    moved = crop_first(_chain(f"{TV}.PILToTensor", f"{COLOR}.ConvertColor", f"{COLOR}.Scale", f"{TV}.CenterCrop"))
    assert _names(moved.chain.per_sample) == ["CenterCrop", "PILToTensor", "ConvertColor", "Scale"]
    assert moved.changes == ("move CenterCrop ahead of PILToTensor, ConvertColor, Scale",)
    blocked = crop_first(_chain(f"{TV}.PILToTensor", "movable.Undeclared", f"{COLOR}.Scale", f"{TV}.RandomCrop"))
    assert _names(blocked.chain.per_sample) == ["PILToTensor", "Undeclared", "RandomCrop", "Scale"]
    assert "Undeclared, which declares nothing" in explore("c", _chain(f"{TV}.PILToTensor", "movable.Undeclared",
                                                                       f"{TV}.RandomCrop")).not_applied[2]


def test_tensor_only_crop_never_moves_before_pil_to_tensor():
    moved = crop_first(_chain(f"{TV}.PILToTensor", "movable.Double", "movable.TensorCrop"))
    assert _names(moved.chain.per_sample) == ["PILToTensor", "TensorCrop", "Double"]
    stuck = crop_first(_chain(f"{TV}.PILToTensor", "movable.TensorCrop"))
    assert stuck.changes == ()
    assert "TensorCrop cannot move ahead of PILToTensor: it does not accept pil" in stuck.reason


def test_user_declared_transforms_move_and_undeclared_do_not():
    found = explore("mine", _chain("movable.Double", "movable.TensorCrop", "movable.RandomGain"))
    assert [v.name for v in found.variants] == ["mine", "mine+crop_first", "mine+per_batch",
                                                "mine+crop_first+per_batch"]
    assert found.not_applied[2:] == ("fast: no transform in the chain declares a fast_form",)
    assert found.variants[2].draws_per_batch == ("RandomGain",)
    assert _names(found.variants[3].chain.per_sample) == ["TensorCrop", "Double"]
    assert _names(found.variants[3].chain.per_batch) == ["BatchRandomGain"]
    still = explore("theirs", _chain("movable.Undeclared", "movable.TensorCrop", "movable.Undeclared"))
    assert [v.name for v in still.variants] == ["theirs"]
    assert len(still.not_applied) == 5


def test_per_batch_moves_only_the_trailing_run_ahead_of_existing_batch_steps():
    found = explore("c", _chain(f"{COLOR}.Scale", "movable.Undeclared", f"{COLOR}.ConvertColor",
                                per_batch=["movable.Undeclared"]))
    moved = next(v for v in found.variants if v.moves == ("per_batch",))
    assert _names(moved.chain.per_sample) == ["Scale", "Undeclared"]
    assert _names(moved.chain.per_batch) == ["BatchConvertColor", "Undeclared"]


def test_a_variant_that_yields_the_same_chain_is_dropped():
    found = explore("same", _chain("movable.SelfFast", f"{COLOR}.Scale"))
    assert [v.name for v in found.variants] == ["same", "same+per_batch"]
