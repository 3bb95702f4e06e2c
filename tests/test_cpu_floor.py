"""`benchmarks/cpu_floor.py`'s count of a step's unavoidable work, against a step small enough
to count by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
cpu_floor = pytest.importorskip("cpu_floor")

# 1 prompt of 1 token, 2 samples of 2 tokens; one layer of width 2, MLP 3, 5-token vocabulary.
TINY = cpu_floor.Shape(
    prompts=1, group=2, length=2, prompt_len=1, hidden=2, mlp=3, layers=1, vocab=5
)


def test_the_tiny_step_is_counted_as_by_hand():
    """Matmul parameters: q, k, v, o 4·2·2 = 16, gate, up, down 3·2·3 = 18, LM head 2·5 = 10:
    44. Tokens: the prompt once and 2 × 2 completion tokens: 5. (query, key) pairs: the
    prompt token sees itself (1); in each row the first completion token sees the prompt and
    itself (2), the second the prompt, the first and itself (3): 1 + 2 · 5 = 11. Decode reads:
    step 0 the prompt's position (once for both rows), step 1 the prompt's and each row's first
    position: 1 + (1 + 2) = 4 positions of K and V, 2 floats each."""
    assert TINY.matmul_params == 44
    work = cpu_floor.step_work(TINY)
    assert work == {
        "train_flop": 6 * 44 * 5,
        "train_attention_flop": 3 * 4 * 2 * 11,
        "decode_flop": 2 * 44 * 5,
        "kv_read_bytes": 4 * 2 * 2 * 4,
    }


def test_the_floor_divides_each_part_by_its_rate():
    work = cpu_floor.step_work(TINY)
    floor = cpu_floor.floor_seconds(
        work, {"train_flops": 100.0, "decode_flops": 40.0, "bandwidth": 8.0}
    )
    assert floor["train_s"] == pytest.approx((1320 + 264) / 100)
    assert floor["rollout_matmul_s"] == pytest.approx(440 / 40)
    assert floor["rollout_kv_s"] == pytest.approx(64 / 8)
    assert floor["step_s"] == pytest.approx(15.84 + 11 + 8)
