"""Framework integrations: one module per agent framework, each importing its framework only when it is imported.

This package imports nothing itself, so ``import agl`` never pulls in a framework. ``langchain`` covers LangChain and
LangGraph, ``openai_agents`` the OpenAI Agents SDK, ``autogen`` AutoGen, ``crewai`` CrewAI. Runners activate each one
inside every rollout when its framework is installed (entry points of group ``agl.integrations``).

What the four share lives once: ``_capture`` (open spans and model calls, the tables and context stacks that hold
them, the one-record-per-call rule, install-once and ``activate()``) and ``_http`` (the gateway headers).
"""
