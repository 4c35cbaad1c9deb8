"""What the tests share, one small module per thing: nothing here is a test, and no test imports another.

ports (a free TCP port), waiting (`eventually`), builders (runs, in-process workers, the model name),
running (in-process workers for a block), processes (`agentrun worker` in a process of its own), serving
(an ASGI app over real HTTP), api (the API tests' tools and fixtures), sse (reading an events stream),
cluster (the emulated Kubernetes API and the operator against it), chart (helm and its renderings), ...
"""
