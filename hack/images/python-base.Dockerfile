# Ebbflow's Python base image: Debian bookworm's CPython 3.11 (the project's Python) from Debian
# packages, on the minbase root image hack/images/debian-base.sh makes with debootstrap, because no
# registry (and so no python:3.11-slim) is reachable here. The operator and trainer images start
# FROM it by default; elsewhere they can start from python:3.11-slim instead (see docs/images.md).
#   python3        the interpreter and standard library (3.11.2)
#   python3-venv   ensurepip, so the image builds can make a virtualenv in /opt/venv
#   ca-certificates  TLS to the Kubernetes API and anything else a training script talks to
#   tini           a tiny init for PID 1: forwards signals to the program and reaps orphaned children
ARG DEBIAN=ebbflow/debian:bookworm
FROM ${DEBIAN}

# One layer; apt's lists, caches and logs and the docs/man pages (dpkg's --path-exclude, as in the
# Debian "slim" images) are left out, so the layer holds only what runs.
RUN printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' >/etc/dpkg/dpkg.cfg.d/ebbflow-slim \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates tini \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old

# UTF-8 without a locale package; unbuffered output so `kubectl logs` shows lines as they happen.
ENV LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1
CMD ["python3"]
