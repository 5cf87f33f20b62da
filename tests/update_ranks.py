"""One rank of a distributed LightningRL update, for tests/test_rl_distributed.py (started by torchrun, or by the test
with torchrun's environment set by hand).

    python tests/update_ranks.py steps OUT MODEL_DIR full|lora   # two steps; every rank saves its weights
    python tests/update_ranks.py load OUT MODEL_DIR full|lora    # rank 0 loads a checkpoint (a resume), then one step
    python tests/update_ranks.py die OUT MODEL_DIR              # rank 1 dies on its first shard; rank 0 says so
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from agl.core.types import Transition
from agl.trainers.config import LoraConfig
from agl.trainers.rl.batching import collate, to_sample
from agl.trainers.rl.distributed import UpdateGroup, UpdateGroupError, follow
from agl.trainers.rl.update import PolicyUpdater, UpdateConfig


def config(lora: bool, strategy: str) -> UpdateConfig:
    return UpdateConfig(
        lr=1e-3,
        device="cpu",
        micro_batch_tokens=96,
        lora=LoraConfig(r=4) if lora else None,
        strategy=strategy,  # type: ignore[arg-type]
    )


def transitions(updater: PolicyUpdater) -> list[Transition]:
    """Three prompts of different lengths, each with three responses (advantages +1, -0.5, -0.5), plus one lone
    call; behaviour log-probs are the current policy's."""
    g = torch.Generator().manual_seed(7)
    vocab = int(updater.model.config.vocab_size)
    out: list[Transition] = []
    for p, length in enumerate([40, 23, 31, 12]):
        prompt = torch.randint(3, vocab, (length,), generator=g).tolist()
        for r, adv in enumerate([1.0, -0.5, -0.5] if p < 3 else [0.7]):
            response = torch.randint(3, vocab, (4 + 2 * r,), generator=g).tolist()
            out.append(
                Transition(
                    span_id=f"p{p}r{r}",
                    agent="a",
                    step=0,
                    prompt_ids=prompt,
                    response_ids=response,
                    response_logprobs=[0.0] * len(response),
                    advantage=adv,
                    temperature=1.0,
                )
            )
    for t in out:
        batch = collate([to_sample(t)], updater.pad_id)
        lp = updater.logprobs(batch)[0]
        t.response_logprobs = [float(x) for x in lp[batch.response_mask[0] > 0]]
    return out


def trainable(updater: PolicyUpdater) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in updater.model.named_parameters() if p.requires_grad}


def main() -> None:
    mode, out, model_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    lora = len(sys.argv) > 4 and sys.argv[4] == "lora"
    torch.manual_seed(int(os.environ["RANK"]))  # different on every rank: the replicas must start from rank 0's
    updater = PolicyUpdater(model_dir, config(lora, "ddp"))
    group = UpdateGroup.join()
    if mode == "steps":
        if group.leads:
            data = transitions(updater)
            metrics = [updater.step(data), updater.step(data)]
            group.stop()
            (out / "metrics.json").write_text(json.dumps(metrics))
        else:
            follow(group, {None: updater})
        torch.save(trainable(updater), out / f"rank{group.rank}.pt")
    elif mode == "load":
        if group.leads:
            data = transitions(updater)
            updater.step(data)
            checkpoint = updater.save(out / "checkpoint")
            state = updater.optimizer_state()
            updater.step(data)  # moves on from the checkpoint; loading it must bring every rank back
            updater.load(checkpoint)
            updater.load_optimizer_state(state)
            torch.save(trainable(updater), out / "loaded.pt")
            updater.step(data)
            group.stop()
        else:
            follow(group, {None: updater})
        torch.save(trainable(updater), out / f"rank{group.rank}.pt")
    elif mode == "die":
        if group.leads:
            try:
                updater.step(transitions(updater))
            except UpdateGroupError as exc:
                (out / "error.txt").write_text(str(exc))
        else:
            group.receive()
            os._exit(3)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
