"""The two-level alpha-beta model (issue 49): a flat ring runs at the uplink's pace, a hierarchical hook pays its
node's legs and then the leaders' ring, one after the other."""

import math

import commhooks_lab as lab

NET = lab.network.TwoLevelNetwork(intra_alpha_us=50, intra_gbps=8, inter_alpha_us=100, inter_gbps=0.1, nodes=2,
                                  ranks_per_node=2)  # fmt: skip
S = 340_000  # bytes of float32 gradients in one bucket


def test_a_flat_ring_runs_every_step_at_the_uplinks_alpha_and_rate():
    """W = 4: 2(W-1) = 6 hops, each with one crossing per node; the uplink carries one rank's ring bytes."""
    flat = {"intra_bytes": 0, "inter_bytes": 1.5 * S, "intra_calls": 0, "inter_allreduce_calls": 1,
            "inter_allgather_calls": 0, "hierarchical": False}  # fmt: skip
    assert math.isclose(lab.network.two_level_seconds(flat, NET), 6 * 100e-6 + 1.5 * S * 8 / 0.1e9)


def test_a_hierarchical_hook_adds_its_node_legs_to_the_leaders_ring():
    """A reduce and a broadcast in the node (L-1 = 1 hop each), then the N = 2 leaders' ring: 2 hops, S across."""
    hier = {"intra_bytes": 1.5 * S, "inter_bytes": S, "intra_calls": 2, "inter_allreduce_calls": 1,
            "inter_allgather_calls": 0, "hierarchical": True}  # fmt: skip
    expected = 2 * 50e-6 + 1.5 * S * 8 / 8e9 + 2 * 100e-6 + S * 8 / 0.1e9
    assert math.isclose(lab.network.two_level_seconds(hier, NET), expected)
    flat = {**hier, "intra_bytes": 0, "inter_bytes": 1.5 * S, "intra_calls": 0, "hierarchical": False}
    assert lab.network.two_level_seconds(hier, NET) < lab.network.two_level_seconds(flat, NET)
