"""Sampling per source (issue 57): the run plan resolves each source's temperature, top-p, top-k and
tool rendering once; rows carry the temperature they were sampled at, and the trainer takes each
row's log-probs at its own, also when rows of two temperatures share a micro-batch."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from rlonce.config import ConfigError, load_config
from rlonce.core.records import (
    Context,
    RecordError,
    Role,
    Segment,
    Sequence,
    TrainingRow,
    sequence_from_dict,
    sequence_to_dict,
    sequence_to_rows,
)
from rlonce.rollout.builders import rollout_spec
from rlonce.rollout.sources import build_sources, plan_sources
from rlonce.train.trainer import OptimSettings, Trainer, pad_rows, token_logprobs

MIXED = """
[harness]
temperature = 0.8
top_p = 0.95
top_k = 40
render_tools = true
[[sources]]
name = "reasoning"
arms = ["single-turn"]
temperature = 0.6
top_k = 0
[[sources]]
name = "toolfind"
top_p = 1
render_tools = false
"""


def test_the_plan_takes_a_sources_sampling_from_it_or_else_from_harness(tmp_path):
    f = tmp_path / "mixed.toml"
    f.write_text(MIXED)
    cfg = load_config(f, [])
    reasoning, toolfind = plan_sources(cfg)
    assert (reasoning.temperature, reasoning.top_p, reasoning.top_k, reasoning.render_tools) == (0.6, 0.95, 0, True)
    assert (toolfind.temperature, toolfind.top_p, toolfind.top_k, toolfind.render_tools) == (0.8, 1.0, 40, False)
    # each source's rollout spec samples and renders as its plan says, whatever [harness] says
    lm = SimpleNamespace(encode=lambda s: [1], decode=lambda ids: "", chat_format="hermes")
    specs = {label: s.spec for label, s in build_sources(plan_sources(cfg), rollout_spec(cfg, lm)).items()}
    assert [(x.sampling.temperature, x.sampling.top_p, x.sampling.top_k, x.limits.render_tools)
            for x in specs.values()] == [(0.6, 0.95, 0, True), (0.8, 1.0, 40, False)]
    # a run without [[sources]]: the one source is [harness]'s
    (one,) = plan_sources(load_config(None, ["harness.temperature=0.7", "harness.top_p=0.9"]))
    assert (one.temperature, one.top_p, one.top_k, one.render_tools) == (0.7, 0.9, 0, False)


def test_a_sources_sampling_is_bounded_like_harness(tmp_path):
    f = tmp_path / "bad.toml"
    for bad in ("temperature = 0", "temperature = 10.5", "top_p = 0", "top_p = 1.5", "top_k = -1"):
        f.write_text(f'[[sources]]\nname = "toolfind"\n{bad}\n')
        with pytest.raises(ConfigError, match="sources"):
            load_config(f, [])


def test_records_carry_the_temperature_and_a_row_has_one():
    def model(temperature):
        return Segment(Role.MODEL, [5, 6], [-0.5, -0.25], [0, 0], "stop", temperature=temperature)

    seq = Sequence("t", "a", [Context([Segment(Role.PROMPT, [1, 2]), model(0.6), Segment(Role.OBSERVATION, [3]),
                                       model(0.6)])])
    (row,) = sequence_to_rows(sequence_from_dict(sequence_to_dict(seq)), 1.0)
    assert row.temperature == 0.6
    seq.contexts[0].segments[-1] = model(0.7)
    with pytest.raises(RecordError, match="several temperatures"):
        sequence_to_rows(seq, 1.0)
    with pytest.raises(RecordError, match="temperature"):
        model(0.0)
    with pytest.raises(RecordError, match="temperature"):
        TrainingRow([1, 2], [0, 1], [0.0, -1.0], [0.0, 1.0], [-1, 0], temperature=float("nan"))


class FixedLogits(torch.nn.Module):
    """Next-token logits log [1/2, 1/4, 1/4] at every position, whatever came before."""

    def __init__(self):
        super().__init__()
        self.logp = torch.nn.Parameter(torch.log(torch.tensor([0.5, 0.25, 0.25])))

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.logp.expand(*input_ids.shape, 3))


def _row(ids: list[int], temperature: float) -> TrainingRow:
    n = len(ids)
    return TrainingRow(ids, [0] + [1] * (n - 1), [0.0] * n, [0.0] * n, [-1] + [0] * (n - 1), temperature=temperature)


def test_rows_of_two_temperatures_in_one_micro_batch_each_get_their_own_logprobs_hand_computed():
    # at T = 0.5 the probabilities are squared and renormalised: [1/4, 1/16, 1/16] / (3/8) = [2/3, 1/6, 1/6]
    rows = [_row([0, 1, 0], 0.5), _row([0, 0, 2, 1], 1.0)]
    b = pad_rows(rows)
    assert b.temp_B.tolist() == [0.5, 1.0]
    lp_BT, _ = token_logprobs(FixedLogits(), b.ids_BT, b.attn_BT, b.temp_B)
    want = [math.log(1 / 6), math.log(2 / 3), math.log(1 / 2), math.log(1 / 4), math.log(1 / 4)]
    assert lp_BT[0, :2].tolist() + lp_BT[1].tolist() == pytest.approx(want, abs=1e-6)
    recomputed = Trainer(FixedLogits(), OptimSettings())._recompute(rows)  # π_old and the reference's path
    assert [v for x in recomputed for v in x.tolist()] == pytest.approx(want, abs=1e-6)


def test_a_mixed_micro_batch_equals_each_row_alone_on_the_embedded_model(lm):
    model = copy.deepcopy(lm.model)
    prompt = lm.encode("<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n")
    rows = [_row(prompt + lm.encode(reply), t) for reply, t in
            (("ls -la", 0.6), ("I will look at the files first.", 1.0), ("cat notes.txt", 0.8))]
    b = pad_rows(rows)
    with torch.no_grad():
        mixed = {"full": token_logprobs(model, b.ids_BT, b.attn_BT, b.temp_B)[0],
                 "masked": token_logprobs(model, b.ids_BT, b.attn_BT, b.temp_B, mask_BT=b.mask_BT)[0]}
        recomputed = Trainer(model, OptimSettings())._recompute(rows)
        for i, r in enumerate(rows):
            n, m = len(r) - 1, torch.tensor(r.loss_mask[1:]) > 0
            alone = pad_rows([r])
            want = token_logprobs(model, alone.ids_BT, alone.attn_BT, r.temperature)[0][0][m]
            for path, lp in mixed.items():
                assert torch.allclose(lp[i, :n][m], want, atol=1e-5), (path, i)
            assert torch.allclose(recomputed[i][m], want, atol=1e-5)
            other = token_logprobs(model, alone.ids_BT, alone.attn_BT, 1.4 - r.temperature)[0][0][m]
            assert float((other - want).abs().max()) > 1e-2  # another temperature gives other numbers
