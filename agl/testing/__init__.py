"""Test helpers shipped with agl, so agents can be tested offline: a fake OpenAI-compatible LLM server."""

from agl.testing.fake_llm import FakeLLM, FakeReply, RecordedRequest, ServedReply, fake_token_ids

__all__ = ["FakeLLM", "FakeReply", "RecordedRequest", "ServedReply", "fake_token_ids"]
