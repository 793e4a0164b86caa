"""Ahead-of-time compiled bundles (docs/bundle.md): `compile.compile_bundle` writes one per cluster shape
and configuration; `load.open_bundle` reads it back for `Session.load` and `EngineConfig.bundle`;
`describe.describe` prints it. Modules are imported where used (the engine imports this package)."""
