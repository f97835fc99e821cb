"""The floor every other part stands on: canonical JSON, atomic writes, path safety, hashing,
revisions, environment settings and file names, the safetensors header. Imports nothing of
cubepack's but :mod:`cubepack.errors`. Private: nothing here is API."""
