"""Runs mypy --strict (pyproject.toml's [tool.mypy]) on memprofd_client, on
the examples and on the README's snippets, as a user's type checker sees the
installed package: the source and its generated stubs in one tree.

    python typecheck.py --stubs BUILD/clients-python

(--stubs: where gen_stubs.py wrote memprofd_client/_proto; the CMake target
memprofd_python_client writes them to build/clients-python). Exits with
mypy's status. ctest runs it as client_python_mypy.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stubs", required=True, help="the directory holding memprofd_client/_proto")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="memprofd-typecheck-") as tmp:
        package = os.path.join(tmp, "memprofd_client")
        shutil.copytree(os.path.join(HERE, "src", "memprofd_client"), package,
                        ignore=shutil.ignore_patterns("__pycache__", "_proto"))
        shutil.copytree(os.path.join(args.stubs, "memprofd_client", "_proto"),
                        os.path.join(package, "_proto"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        examples = sorted(glob.glob(os.path.join(HERE, "examples", "*.py")))
        with open(os.path.join(HERE, "README.md")) as f:
            snippets = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        for i, code in enumerate(snippets):
            path = os.path.join(tmp, "readme_snippet_%d.py" % i)
            with open(path, "w") as f:
                f.write(code)
            examples.append(path)
        env = dict(os.environ, MYPYPATH=tmp)
        cmd = [sys.executable, "-m", "mypy", "--config-file", os.path.join(HERE, "pyproject.toml"),
               "--cache-dir", os.path.join(tmp, ".mypy_cache"), "-p", "memprofd_client"]
        r = subprocess.run(cmd, env=env, cwd=tmp)
        if r.returncode != 0:
            return r.returncode
        # The examples and snippets as a user's scripts: the package found on
        # MYPYPATH.
        r = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                            os.path.join(HERE, "pyproject.toml"), "--cache-dir",
                            os.path.join(tmp, ".mypy_cache")] + examples, env=env, cwd=tmp)
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
