"""Framework integrations: one module per agent framework, each importing its framework only when it is imported.

This package imports nothing itself, so ``import agl`` never pulls in a framework. ``langchain`` covers LangChain and
LangGraph, ``openai_agents`` the OpenAI Agents SDK, ``autogen`` AutoGen, ``crewai`` CrewAI. Integrations are entry
points of group ``agl.integrations``, named for their framework's module (``langchain_core``, ``agents``,
``autogen_core``, ``crewai``). A runner activates one inside a rollout only when its agent uses that framework: the
module is imported when the rollout starts (the agent's module imported it), or the runner was told to
(``Trainer(integrations=[...])``, ``agl runner --integration``). Frameworks the agent does not use are never
imported, so one framework's hooks and telemetry never see another's agent; see
``agl.core.integration_scopes.integration_scopes``.
Activating an integration also switches off its framework's own telemetry exporter (``agl.core.telemetry``).

What the four share lives once: ``_capture`` (open spans and model calls, the tables and context stacks that hold
them, the one-record-per-call rule, install-once and ``activate()``) and ``_http`` (the gateway headers).
"""
