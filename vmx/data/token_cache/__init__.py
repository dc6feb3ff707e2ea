"""The token cache: a task's examples after every preprocessor and the feature converter,
stored once as fixed-size rows so that the index reader (vmx/data/stream.py) reads any
example in constant time. `format` (the layout and its digests), `table` (reading, local
or by ranges from a bucket, verified), `fingerprint` (what a cache is built from),
`writer` (one shard), `build` (find, build locally, refuse), `beam` (build on Apache
Beam)."""
