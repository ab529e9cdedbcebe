"""What every gRPC server of the project runs on: the cache daemon (``kvstore serve``) and
the storage node (``kvstore node``) alike.

Per-request limits (``limits``), bearer-token authentication and namespace ownership
(``auth``), the authentication/error-mapping/timing mixin of every servicer (``plumbing``),
Prometheus metrics (``metrics``), startup checks, TLS credentials and binding (``startup``),
and the server itself with its health service and signal handling (``runner``). Part of the
core: it speaks the wire layer and imports nothing above the core.
"""
