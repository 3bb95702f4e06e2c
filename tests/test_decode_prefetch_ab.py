"""`benchmarks/decode_prefetch_ab.py`'s prefetching product does the same arithmetic as the
library's `panel_linear`, so that its A/B times prefetches and nothing else."""

import sys
from pathlib import Path

import pytest
import torch

from rlvr.models import cpu_kernels

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
decode_prefetch_ab = pytest.importorskip("decode_prefetch_ab")


@pytest.mark.skipif(cpu_kernels.load() is None, reason="the CPU kernels cannot be built here")
@pytest.mark.parametrize("hint", [0, 3])
def test_the_prefetching_product_equals_panel_linear_and_x_w_t(tmp_path, hint):
    """Every product of a 16-position step, with the whole next cache prefetched and without,
    gives the same outputs, to the bit, and those are x Wᵀ of the unpacked weights (checked
    for the gate/up product against PyTorch's matmul)."""
    library = decode_prefetch_ab.build_variant(tmp_path)
    step = decode_prefetch_ab.DecodeStep(library, cached=16, fraction=1.0, hint=hint)
    for layer in range(decode_prefetch_ab.LAYERS):
        for (offset, name), share in zip(step.products, step.shares, strict=True):
            step.product(layer + offset, name, None)
            plain = step.outputs[name].clone()
            step.outputs[name].fill_(float("nan"))
            step.product(layer + offset, name, share)
            assert torch.equal(step.outputs[name], plain), (layer, name)
    assert step.shares[0][0] == 0 and step.shares[-1][1] == 2 * 32 * 4 * 16 * 48 // 16

    g = torch.Generator().manual_seed(1)
    weight = torch.randn(2 * decode_prefetch_ab.MLP, decode_prefetch_ab.HIDDEN, generator=g)
    step.library.pack_panels(weight.data_ptr(), step.weights[0]["gate_up"].data_ptr(),
                             *weight.shape)  # fmt: skip
    step.product(0, "gate_up", step.shares[1])
    want = step.inputs["gate_up"] @ weight.T
    torch.testing.assert_close(step.outputs["gate_up"], want, rtol=1e-5, atol=1e-4)
