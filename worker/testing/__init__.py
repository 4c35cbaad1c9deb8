"""Local stand-ins for model providers, used by the demo, `agentrun dev`, the benchmarks and the tests.

A Messages API server (with streaming), a Chat Completions server and scripted in-process clients.
Nothing in production imports this package.
"""
