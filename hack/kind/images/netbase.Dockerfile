# Userspace networking tools for the kube-proxy and flannel images (upstream: distroless-iptables
# and alpine). Built from the debootstrapped Debian image; BASE is passed by build-node-image.sh.
ARG BASE
FROM ${BASE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       iptables nftables conntrack iproute2 kmod ca-certificates ipset \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/debconf/* /usr/share/doc/* /usr/share/man/* /var/log/*
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
      ln -sfn /usr/sbin/iptables-wrapper /etc/alternatives/$n; \
    done && iptables-legacy --version && iptables-nft --version
