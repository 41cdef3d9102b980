"""Bundles, the publisher's output and the device's input: format, verification, transport.

- `manifest`: a manifest's rules checked on its bytes alone (format, paths, hashes, sizes).
- `format`: write a manifest, verify a bundle's files against docs/BUNDLE.md, open it; where bundles live.
- `repository`: the publisher's signed (TUF) repository over a bundle.
- `trust`: whom the device trusts (publisher roots by fingerprint); `signed`: its TUF updater source from that root;
  `sources`: which source a pull reads; `installed_versions`, `version_use`: the installed bundle versions and
  which ones a running localpers still reads; `backbone_choice`: the backbone a bundle names.
- `fetcher`: the bytes of a signed pull, over http(s) or from a local repository directory.
- `transport`: the HTTP rules of a signed pull over the network (redirects only to http(s), never from https to
  http nor from a public address into the local network; no proxy for loopback).
- `keys`: the publisher's signing keys; `resigning`: renewing its metadata; `repository_lock`: one repo command
  at a time; `record`: what a pull installed (`.pulled.json`).
- `pull`: fetch a bundle (signed, or a local directory with --unsigned) and install it atomically;
  `pull_downloads`: its downloads and the checks around them; `pull_publisher`: which publisher it may install
  from, and the record it leaves.
- `serve`: serve a repository or one verified bundle read-only over HTTP; `serve_handler`: how each request is
  read and answered (its limits, byte ranges, the log); `served_files`: which files a repository exposes (its TUF
  metadata and targets whose bytes match their names), listed again as it is re-signed.

Nothing here reads user data or runs a model.
"""
