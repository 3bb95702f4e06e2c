"""Clip-Cov's and KL-Cov's token picks: the centred covariance by hand, the counts, the band."""

import torch

from rlvr.algorithms.covariance import clip_cov_tokens, kl_cov_tokens, token_covariance

ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
LOGP = torch.tensor([[-0.5, -2.5, -1.0], [-0.5, -3.5, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_covariance_by_hand():
    """Over the 5 masked tokens Ā = 0.2 and mean log π = -1.6: (A - 0.2)(log π + 1.6)."""
    cov = token_covariance(ADV, LOGP, MASK)
    want = torch.tensor(
        [[0.8 * 1.1, 0.8 * -0.9, 0.8 * 0.6], [-1.2 * 1.1, -1.2 * -1.9, -torch.inf]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(cov, want)
    assert cov.sum().isinf() and torch.isfinite(cov[MASK.bool()]).all()


def test_kl_cov_picks_the_largest_share():
    cov = token_covariance(ADV, LOGP, MASK)
    one = kl_cov_tokens(cov, MASK, 0.01)  # int(0.05) = 0, at least one: the 2.28
    assert one.tolist() == [[False, False, False], [False, True, False]]
    two = kl_cov_tokens(cov, MASK, 0.4)  # int(2.0) = 2: 2.28 and 0.88
    assert two.tolist() == [[True, False, False], [False, True, False]]
    everything = kl_cov_tokens(cov, MASK, 1.0)
    assert everything.tolist() == MASK.bool().tolist()  # never a masked position
    assert not kl_cov_tokens(cov, torch.zeros(2, 3), 1.0).any()


def test_clip_cov_draws_within_the_band_and_repeats_with_its_seed():
    """The covariances are 0.88, -0.72, 0.48 / -1.32, 2.28. In the band (0.5, 1.0) only the
    0.88 lies; in (0, 3) the 0.88, 0.48 and 2.28 do: two of them drawn at a share of 0.4, the
    same two for the same seed."""
    cov = token_covariance(ADV, LOGP, MASK)

    def draw(low, high, fraction, seed):
        generator = torch.Generator().manual_seed(seed)
        return clip_cov_tokens(cov, MASK, fraction, low, high, generator)

    assert draw(0.5, 1.0, 0.4, 0).tolist() == [[True, False, False], [False, False, False]]
    inside = torch.tensor([[True, False, True], [False, True, False]])
    picks = [draw(0.0, 3.0, 0.4, seed) for seed in range(8)]
    assert all(int(p.sum()) == 2 and not (p & ~inside).any() for p in picks)
    assert len({tuple(p.flatten().tolist()) for p in picks}) > 1  # the draw varies by seed
    assert torch.equal(draw(0.0, 3.0, 0.4, 5), draw(0.0, 3.0, 0.4, 5))
    assert not draw(10.0, 20.0, 1.0, 0).any()  # nothing in the band: nothing left out


def test_a_lone_token_has_covariance_0_and_the_band_is_open():
    # one masked token is its own mean: (A − A)(log π − log π) = 0
    lone = token_covariance(
        torch.tensor([[2.0, 5.0]]), torch.tensor([[-1.0, -3.0]]), torch.tensor([[1, 0]])
    )
    assert lone.tolist() == [[0.0, -torch.inf]]
    # Clip-Cov draws from the open band (1, 5): the covariances on its ends are not candidates
    cov = torch.tensor([[1.0, 2.0, 5.0]], dtype=torch.float64)
    picked = clip_cov_tokens(cov, torch.ones(1, 3), 1.0, 1.0, 5.0, torch.Generator().manual_seed(0))
    assert picked.tolist() == [[False, True, False]]
