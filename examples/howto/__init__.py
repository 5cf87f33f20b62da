"""Runnable examples the how-to pages quote by section (``--8<--``): each runs against ``agl.testing.FakeLLM`` or the
tiny model, and tests/test_howto.py runs every one of them."""
