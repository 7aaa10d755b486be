"""The consumer's Avro reader and Protobuf reader of plain scalar fields, in C against Python's
own API (no library to link). Everything else about the package is in pyproject.toml;
setuptools takes C extensions from here."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("consumers.decoding._avro_body", ["consumers/decoding/_avro_body.c"]),
        Extension("consumers.decoding._proto_body", ["consumers/decoding/_proto_body.c"]),
    ]
)
