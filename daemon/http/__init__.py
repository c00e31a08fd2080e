"""The HTTP machinery both listeners share: what one connection may take, enforced as
bytes arrive (`listener`), serving ASGI apps (`serving`), the JSON error bodies and the
refusals their OpenAPI documents name (`errors`), the public listener's OpenAPI document
(`public_api`) and the uvicorn releases the listener is tested against
(`uvicorn_version`). It knows no stage: the stages' routes come to it from `daemon.app`.
"""
