"""Framework integrations: one module per agent framework, each importing its framework only when it is imported.

This package imports nothing itself, so ``import agl`` never pulls in a framework. ``agl.integrations.langchain``
covers LangChain and LangGraph.
"""
