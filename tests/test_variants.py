"""Variant generation: exactly which variants, in which order, and only legal moves."""

import pytest
from conftest import compose_spec

from pipebench.explore.chain import GPU_DECODER, MOVES, Chain, SampleSource, short_name
from pipebench.explore.chain_moves import crop_first, late_cast, to_device
from pipebench.explore.decode_moves import decoder, gpu_decoder
from pipebench.explore.variants import explore, ladder_of
from pipebench.transforms.decode import decoder_note

TV = "torchvision.transforms"
MASK = "pipebench.transforms.mask"
COLOR = "pipebench.transforms.color"


def _names(nodes):
    return [short_name(n) for n in nodes]


def _chain(*targets, per_batch=()):
    return Chain(tuple({"_target_": t, **({"size": 8} if "Crop" in t else {})} for t in targets),
                 tuple({"_target_": t} for t in per_batch))


# Where nvImageCodec is missing: the ladder of the other decode moves (tests/test_region_decode.py has its own).
NO_REGION = "nvImageCodec is not installed (a test's stand-in)"


def test_seed_chain_ladder_starts_with_the_region_decode():
    spec = compose_spec(["transform=yuv_mask"])
    found = explore("yuv_mask", Chain(spec.per_sample, spec.per_batch), region_problem="")
    assert [v.name for v in found.variants] == [
        "yuv_mask", "yuv_mask+region_decode", "yuv_mask+decoder", "yuv_mask+crop_first", "yuv_mask+fast",
        "yuv_mask+per_batch", "yuv_mask+late_cast", "yuv_mask+to_device", "yuv_mask+gpu_decoder",
        "yuv_mask+gpu_region_decode", "yuv_mask+region_decode+fast", "yuv_mask+decoder+fast",
        "yuv_mask+region_decode+fast+per_batch",
        "yuv_mask+region_decode+fast+late_cast", "yuv_mask+region_decode+fast+to_device"]


def test_seed_chain_variants_in_order():
    spec = compose_spec(["transform=yuv_mask"])
    found = explore("yuv_mask", Chain(spec.per_sample, spec.per_batch), region_problem=NO_REGION)
    assert [v.name for v in found.variants] == [
        "yuv_mask", "yuv_mask+decoder", "yuv_mask+crop_first", "yuv_mask+fast", "yuv_mask+per_batch",
        "yuv_mask+late_cast", "yuv_mask+to_device", "yuv_mask+gpu_decoder", "yuv_mask+decoder+fast",
        "yuv_mask+decoder+fast+per_batch",
        "yuv_mask+decoder+fast+late_cast", "yuv_mask+decoder+fast+to_device"]
    assert found.not_applied == (f"region_decode: {NO_REGION}", "tensor_path: no step runs on the PIL image before PILToTensor (the decoder move "
                                 "covers it)", "reduced_decode: the first step, PILToTensor, does not resize the "
                                 "image down (declares no draft_form)", f"gpu_region_decode: {NO_REGION}")
    late = next(v for v in found.variants if v.name == "yuv_mask+decoder+fast+late_cast")
    assert late.moves == ("decoder", "fast", "late_cast")
    assert _names(late.chain.per_sample) == ["DecodeJpeg", "RandomCrop", "TorchRandomMask"]
    assert late.chain.per_batch == ()
    assert _names(late.chain.on_device) == ["BatchConvertColor", "BatchScale"]
    assert late.changes == ("replace PILToTensor with DecodeJpeg (decode the JPEG file straight to a uint8 tensor, "
                            f"with {decoder_note()})",
                            "replace RandomMask with TorchRandomMask",
                            "run ConvertColor after the host-to-device copy as BatchConvertColor",
                            "run Scale after the host-to-device copy as BatchScale")
    assert late.chain.per_sample[1] == {"_target_": f"{TV}.RandomCrop", "size": 256}, "arguments travel"
    assert late.chain.per_sample[2] == {"_target_": f"{MASK}.TorchRandomMask", "ratio": 0.25}
    assert not late.needs_device and next(v for v in found.variants if v.name == "yuv_mask+to_device").needs_device
    # The mask's batch form draws once a sample, so moving it keeps the distribution; the crop stays.
    on_device = next(v for v in found.variants if v.name == "yuv_mask+to_device")
    assert _names(on_device.chain.per_sample) == ["PILToTensor", "RandomCrop"]
    assert _names(on_device.chain.on_device) == ["BatchRandomMask", "BatchConvertColor", "BatchScale"]
    assert on_device.draws_per_batch == ()
    # The catalogue's hand-written step 3 is among the single moves' chains, chain for chain.
    hand = compose_spec(["transform=yuv_mask_crop_first"])
    crop = next(v for v in found.variants if v.name == "yuv_mask+crop_first")
    assert _names(crop.chain.per_sample)[:2] == _names(hand.per_sample)[:2] == ["RandomCrop", "PILToTensor"]


def test_the_ladder_is_the_waterfall_path():
    spec = compose_spec(["transform=yuv_mask"])
    found = explore("yuv_mask", Chain(spec.per_sample, spec.per_batch), region_problem=NO_REGION)
    winner = next(v for v in found.variants if v.name == "yuv_mask+decoder+fast+late_cast")
    assert [v.name for v in ladder_of(winner, found.variants)] == [
        "yuv_mask", "yuv_mask+decoder", "yuv_mask+decoder+fast", "yuv_mask+decoder+fast+late_cast"]


def test_decoder_does_not_apply_to_a_chain_of_tensors_and_says_why():
    moved = decoder(_chain("movable.Double", f"{COLOR}.Scale"))
    assert moved.changes == ()
    assert moved.reason == "decoder: the chain starts from tensors (Double accepts only tensors): there is no " \
                           "image file to decode"
    blocked = decoder(_chain(f"{TV}.Resize", f"{TV}.PILToTensor"))
    assert "Resize runs on the PIL image before PILToTensor" in blocked.reason


def test_decoder_takes_pil_side_crops_after_it():
    moved = decoder(_chain(f"{TV}.RandomCrop", f"{TV}.PILToTensor", f"{COLOR}.Scale"))
    assert _names(moved.chain.per_sample) == ["DecodeJpeg", "RandomCrop", "Scale"]
    assert moved.changes[1] == "move RandomCrop after DecodeJpeg"


def test_late_cast_moves_only_casts_and_to_device_only_per_sample_draws():
    chain = _chain(f"{TV}.PILToTensor", "movable.RandomGain", f"{COLOR}.ConvertColor", f"{COLOR}.Scale")
    cast = late_cast(chain)
    assert _names(cast.chain.per_sample) == ["PILToTensor", "RandomGain"]
    assert _names(cast.chain.on_device) == ["BatchConvertColor", "BatchScale"]
    moved = to_device(chain)
    assert _names(moved.chain.on_device) == ["BatchConvertColor", "BatchScale"], "one draw a batch never moves"
    assert late_cast(_chain(f"{TV}.PILToTensor", f"{MASK}.RandomMask")).reason.startswith(
        "late_cast: the last step, RandomMask is not a cast to float")
    # Steps already in the collate move after the copy as they are.
    batched = late_cast(_chain(f"{TV}.PILToTensor", per_batch=[f"{COLOR}.BatchConvertColor", f"{COLOR}.BatchScale"]))
    assert batched.chain.per_batch == () and _names(batched.chain.on_device) == ["BatchConvertColor", "BatchScale"]


def test_undeclared_transforms_never_move_by_any_move():
    chain = _chain("movable.Undeclared", "movable.Undeclared")
    found = explore("theirs", chain)
    assert [v.name for v in found.variants] == ["theirs"]
    assert len(found.not_applied) == len(MOVES)


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
                                                                       f"{TV}.RandomCrop")).not_applied[3]


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
    assert found.not_applied[2:5] == (
        "decoder: the chain starts from tensors (Double accepts only tensors): there is no image file to decode",
        "reduced_decode: the first step, Double, does not resize the image down (declares no draft_form)",
        "fast: no transform in the chain declares a fast_form")
    assert found.variants[2].draws_per_batch == ("RandomGain",)
    assert _names(found.variants[3].chain.per_sample) == ["TensorCrop", "Double"]
    assert _names(found.variants[3].chain.per_batch) == ["BatchRandomGain"]
    still = explore("theirs", _chain("movable.Undeclared", "movable.TensorCrop", "movable.Undeclared"))
    assert [v.name for v in still.variants] == ["theirs"]
    assert len(still.not_applied) == len(MOVES)


def test_per_batch_moves_only_the_trailing_run_ahead_of_existing_batch_steps():
    found = explore("c", _chain(f"{COLOR}.Scale", "movable.Undeclared", f"{COLOR}.ConvertColor",
                                per_batch=["movable.Undeclared"]))
    moved = next(v for v in found.variants if v.moves == ("per_batch",))
    assert _names(moved.chain.per_sample) == ["Scale", "Undeclared"]
    assert _names(moved.chain.per_batch) == ["BatchConvertColor", "Undeclared"]


def test_a_variant_that_yields_the_same_chain_is_dropped():
    found = explore("same", _chain("movable.SelfFast", f"{COLOR}.Scale"))
    assert [v.name for v in found.variants] == ["same", "same+per_batch", "same+late_cast"]


DECODE = "pipebench.transforms.decode"
JPEG = SampleSource("JPEG", (533, 800))


@pytest.mark.parametrize("chain, mask", [("yuv_mask", "RandomMask"), ("yuv_mask_crop_first", "FastRandomMask")])
def test_gpu_decoder_reads_bytes_in_the_worker_and_does_the_rest_after_the_copy(chain, mask):
    spec = compose_spec([f"transform={chain}"])
    found = explore(chain, Chain(spec.per_sample, spec.per_batch), source=JPEG, device="cuda")
    moved = [v for v in found.variants if GPU_DECODER in v.moves]
    assert [v.moves for v in moved] == [(GPU_DECODER,)], "on crop_first+fast it gives the same chain: dropped"
    assert moved[0].needs_device and moved[0].draws_per_batch == ()
    assert moved[0].chain == Chain(
        ({"_target_": f"{DECODE}.ReadJpegBytes"},), (),
        ({"_target_": f"{DECODE}.BatchDecodeJpeg", "device": "cuda"},
         {"_target_": "pipebench.transforms.crop.BatchRandomCrop", "size": 256},
         {"_target_": f"{MASK}.BatchRandomMask", "ratio": 0.25},
         {"_target_": f"{COLOR}.BatchConvertColor"}, {"_target_": f"{COLOR}.BatchScale"}))
    assert moved[0].changes == (
        "read the JPEG bytes in the worker (ReadJpegBytes) in place of PIL's decode and PILToTensor",
        f"decode the batch on the GPU after the copy (BatchDecodeJpeg, nvJPEG through {decoder_note('cuda')})",
        "crop on the device: RandomCrop as BatchRandomCrop",
        f"run {mask} after the host-to-device copy as BatchRandomMask",
        "run ConvertColor after the host-to-device copy as BatchConvertColor",
        "run Scale after the host-to-device copy as BatchScale")


def test_gpu_decoder_names_the_host_cpu_where_there_is_no_device_and_takes_batched_steps_as_they_are():
    moved = gpu_decoder(_chain(f"{TV}.PILToTensor", f"{TV}.RandomCrop", per_batch=[f"{COLOR}.BatchScale"]))
    assert moved.chain.on_device[0] == {"_target_": f"{DECODE}.BatchDecodeJpeg", "device": "cpu"}
    assert _names(moved.chain.on_device) == ["BatchDecodeJpeg", "BatchRandomCrop", "BatchScale"]
    assert moved.chain.per_batch == () and "on cpu here" in moved.changes[1]


@pytest.mark.parametrize("targets, reason", [
    ((f"{TV}.PILToTensor", f"{TV}.RandomCrop", "movable.Undeclared", f"{COLOR}.Scale"),
     "gpu_decoder: Undeclared is not batch-able with a batch form, so it cannot run on the device after the decode"),
    ((f"{TV}.PILToTensor", f"{TV}.RandomCrop", "movable.RandomGain"),
     "gpu_decoder: RandomGain is not batch-able with a batch form that draws once a sample, so it cannot run on "
     "the device after the decode"),
    ((f"{TV}.PILToTensor", f"{TV}.CenterCrop"),
     "gpu_decoder: CenterCrop, the crop after the decode, has no batch form"),
    ((f"{TV}.PILToTensor", f"{COLOR}.Scale", f"{TV}.RandomCrop"),
     "gpu_decoder: no crop follows the decode (Scale comes first), so the decoded images cannot be stacked into one "
     "batch"),
    ((f"{TV}.Resize", f"{TV}.PILToTensor", f"{TV}.RandomCrop"),
     "gpu_decoder: Resize runs on the PIL image before PILToTensor, and only a crop can follow the decoder"),
    ((f"{TV}.ToTensor", f"{TV}.RandomCrop"),
     "gpu_decoder: no step declares a decoder_form (a PIL->tensor conversion such as PILToTensor)"),
])
def test_gpu_decoder_says_which_step_blocks_it_in_one_line(targets, reason):
    moved = gpu_decoder(_chain(*targets), JPEG)
    assert moved.changes == () and moved.reason == reason


@pytest.mark.parametrize("source", [SampleSource("PNG", (533, 800)), SampleSource("tensor")])
def test_gpu_decoder_is_skipped_on_data_that_are_not_jpeg_files(source):
    spec = compose_spec(["transform=yuv_mask"])
    found = explore("yuv_mask", Chain(spec.per_sample, spec.per_batch), source=source)
    assert all(GPU_DECODER not in v.moves for v in found.variants)
    assert f"gpu_decoder: the dataset gives {source.kind} samples, not JPEG files: decode moves skipped" \
        in found.not_applied
