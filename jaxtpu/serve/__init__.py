"""`jaxtpu serve`: Perspective API's `comments:analyze` answered by a model trained with jaxtpu
(a run directory, or an export), on a real ASGI stack (Starlette on uvicorn), with concurrent
requests batched together (`batcher`), the models behind it (`backends`), the HTTP application
(`app`), its page for people (`page`) and the command (`command`). What the API reads and
writes is `jaxtpu.core.serving`'s, free of any framework."""
