"""SFT that resumes: a run cut into pieces, with a save and a load in between, trains exactly as one piece."""
import io

import pytest
import torch

from algos.attnrl.gpt import GPT, GPTConfig
from algos.attnrl.lm import Policy
from algos.attnrl.sft import SFTConfig, SFTRun, pretrain
from envs.reasoning.task import ReasoningTask, ReasoningTaskConfig


def _policy(task, init_seed):
    torch.manual_seed(init_seed)
    return Policy(GPT(GPTConfig(vocab_size=task.tokenizer.vocab_size, n_layer=1, n_embd=32)), task.tokenizer)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sft_resumed_from_a_checkpoint_matches_one_uninterrupted_run():
    task = ReasoningTask(ReasoningTaskConfig(max_steps=3))
    # the checkpoint carries the problem RNG, the optimizer's moments, the warm-up schedule and the history
    cfg = SFTConfig(max_steps=14, batch_size=4, eval_every=4, eval_problems_per_difficulty=2, warmup_steps=5,
                    target_short_accuracy=1.0)
    whole = _policy(task, 0)
    info = pretrain(whole, task, cfg)

    first = SFTRun(_policy(task, 0), task, cfg)
    assert first.advance(steps=6) is False and first.step == 6
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = SFTRun(_policy(task, 1), task, cfg)  # other initial weights: all must come from the checkpoint
    resumed.load_state_dict(torch.load(buf, weights_only=False, map_location="cpu"))
    assert resumed.advance() is True
    out = resumed.result()

    assert out["steps"] == info["steps"] == 14
    assert [h["difficulty_cap"] for h in out["history"]] == [h["difficulty_cap"] for h in info["history"]]
    assert out["history"] == info["history"]
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.policy.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_sft_checkpoint_of_another_config_is_refused():
    task = ReasoningTask(ReasoningTaskConfig(max_steps=2))
    run = SFTRun(_policy(task, 0), task, SFTConfig(max_steps=3, batch_size=2, eval_problems_per_difficulty=1))
    run.advance(steps=1)
    state = run.state_dict() | {"cap": 2}  # a curriculum level reached before the checkpoint comes back with it
    again = SFTRun(_policy(task, 0), task, run.cfg)
    again.load_state_dict(state)
    assert again.cap == 2 and again.step == 1
    other = SFTRun(_policy(task, 0), task, SFTConfig(max_steps=4, batch_size=2, eval_problems_per_difficulty=1))
    with pytest.raises(ValueError, match="SFT checkpoint was made with"):
        other.load_state_dict(run.state_dict())


def test_sft_stops_at_its_time_limit_and_reports_not_finished():
    task = ReasoningTask(ReasoningTaskConfig(max_steps=2))
    run = SFTRun(_policy(task, 0), task, SFTConfig(max_steps=50, batch_size=2, eval_problems_per_difficulty=1))
    assert run.advance(until=0.0) is False and run.step == 0  # past the deadline before the first step
    assert run.advance(steps=2) is False and run.step == 2
