"""Data: documents from files or datasets (sources), token shards (shards), their preparation (prepare), the
training loader (loader), and the embedded default corpus (embedded). Import the submodules directly."""
