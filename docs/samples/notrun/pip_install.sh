make wheel                                   # dist/nexar-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl
pip install dist/nexar-*.whl                 # libnexar.so, the Python package and the `nexar` CLI
nexar info                                   # version, addresses, transports
