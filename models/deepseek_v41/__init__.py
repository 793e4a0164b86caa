"""DeepSeek-V4.1-Flash: config, layer roles, checkpoint layout and I/O, tiny random checkpoints.

Import the submodules directly (`config`, `layers_plan`, `checkpoint_spec`, `checkpoint_io`, `tiny`);
this package file stays empty so importing the config does not pull in torch.
"""
