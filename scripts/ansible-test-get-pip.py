"""pip bootstrap for the virtual environments ansible-test creates (it runs `python get-pip.py PACKAGES
[--no-setuptools] [--no-wheel]` with the file it caches at ~/.ansible/test/cache/get_pip_<version>.py).

ansible-test downloads that script from ci-files.testing.ansible.com, which this machine and CI cannot
reach; scripts/ansible-test puts this file there instead. It does the same job from what is reachable:
the interpreter's own ensurepip, then the pinned packages from the configured package index (PyPI).
"""
import subprocess
import sys


def main():
    args = sys.argv[1:]
    packages = [a for a in args if not a.startswith("-")]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"], stdout=subprocess.DEVNULL)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.check_call(pip + ["install", "--quiet"] + packages)
    # ensurepip of Python < 3.12 also installs setuptools; get-pip.py leaves it out when asked to.
    drop = [name for name, flag in (("setuptools", "--no-setuptools"), ("wheel", "--no-wheel")) if flag in args]
    if drop:
        subprocess.check_call(pip + ["uninstall", "--quiet", "--yes"] + drop,
                              stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
