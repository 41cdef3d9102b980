"""`localpers api`: a local OpenAI-compatible endpoint over the device's personalized generation.

`requests` parses OpenAI bodies, `backend` picks the user and generates, `app` is the ASGI app, `server`
binds it (loopback by default). The endpoint only listens; it opens no outgoing connection.
"""
