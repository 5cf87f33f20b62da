"""What LightningRL and SFT do alike with the weights they train: publish where they are served, and validate them.

Both trainers serve one policy, or one LoRA adapter per listed agent over a shared base model; ``publish`` writes the
``LLM`` resource (the endpoint, the default sampling and, per agent, the route to its adapter under the model name the
backend said it serves) and the ``ModelWeights`` resource (where the weights are on disk) in one resource set, keeping
every other resource of the latest version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agl.core.types import LLM, ModelWeights, PolicyRoute, ResourceSet

if TYPE_CHECKING:
    from agl.core.context import TrainContext
    from agl.trainers.config import ServingConfig

#: The version of the untrained base model, which per-agent policies leave as it is.
BASE_VERSION = "v0"


def adapter_model(model_name: str, agent: str) -> str:
    """The model name an agent's adapter is served under by agl's policy server: ``policy`` + ``writer`` →
    ``policy/writer``."""
    return f"{model_name}/{agent}"


class Endpoint(Protocol):
    """Where the policy is served (``PolicyBackend``)."""

    @property
    def base_url(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def api_key(self) -> str: ...


def publish(
    ctx: TrainContext,
    serving: ServingConfig,
    endpoint: Endpoint,
    *,
    model_dir: str | Path,
    version: str,
    path: str | Path | None,
    routes: Mapping[str, PolicyRoute],
    lora: bool,
) -> ResourceSet:
    """Publish the served policy as ``version``, its weights at ``path`` (None: untrained, the base ``model_dir``).

    With ``routes`` (per-agent adapters) the LLM resource names the untrained base model and routes each agent to its
    adapter at the adapter's own version; ``path`` is then the folder of the adapters and their ``manifest.json``.
    ``lora``: the single policy trains a LoRA adapter, so its trained weights are an adapter over ``model_dir``."""
    trained = path is not None
    return ctx.publish_changes(
        {
            serving.llm_resource: LLM(
                base_url=endpoint.base_url,
                model=endpoint.model,
                api_key=endpoint.api_key,
                sampling={"temperature": serving.temperature, "max_tokens": serving.max_tokens},
                weights_version=BASE_VERSION if routes else version,
                routes=dict(routes),
            ),
            serving.policy_resource: ModelWeights(
                path=str(path if path is not None else model_dir),
                version=version,
                base_model=str(model_dir) if trained else None,
                adapter=bool(routes) or (lora and trained),
            ),
        }
    )


def validate(ctx: TrainContext, val_tasks: Sequence[Any] | None, resources: ResourceSet, desc: str) -> dict[str, Any]:
    """One pass over ``val_tasks`` on ``resources``: the mean reward and success rate, as ``val/…`` metrics."""
    batch = ctx.rollouts(list(val_tasks or []), mode="val", resources_version=resources.version, desc=desc)
    summary = batch.summary
    return {"val/mean_reward": summary["mean_reward"], "val/success_rate": summary["success_rate"]}
