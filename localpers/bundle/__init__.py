"""Bundles, the publisher's output and the device's input: format, verification, transport.

- `format`: write a manifest, verify a bundle against every rule in docs/BUNDLE.md, open it.
- `repository`: the publisher's signed (TUF) repository over a bundle.
- `signed`: the device's trusted publisher roots and its TUF updater source.
- `transport`: the HTTP rules both pull paths share (http only, no redirects off the host).
- `pull`: fetch a bundle (signed, or a local directory with --unsigned) and install it atomically.
- `serve`: serve a repository or one verified bundle read-only over HTTP.

Nothing here reads user data or runs a model.
"""
