"""What the tests share, one small module per thing; nothing here is a test, and no test imports another.

ports: a free TCP port. waiting: `eventually`. builders: a new run, an in-process worker, the model name.
running: in-process workers for a block. processes: `agentrun worker` in a process of its own. serving: an
ASGI app over real HTTP or in-process. api: the API tests' tools, app and fixtures. cli: the `agentrun`
command in-process. sse: reading an events stream. event_tools: tools for worker processes. cluster: the
emulated Kubernetes API and the operator against it. chart: helm and the chart. roles: the database roles
of docs/database-role.sql. llm, mcp: what the model client and MCP tests share.
"""
