"""``python ray_node_ip.py IFACE FIXED [PEER...]``: the address a Ray node announces, printed (``ray_cluster.sh``).

RAY_NODE_IP_ADDRESS (FIXED) or RAY_IFACE's IPv4 address if set, else the local address of this node's route to the
first PEER that resolves (a worker's peer is the head, the head's the other nodes), else Ray's own choice (the
route to a public address; no packet is sent), else the host name's. A loopback address is refused while a peer is
not on loopback: Ray nodes elsewhere could not reach it. Standard library only, run by path on every node.
"""

import fcntl
import ipaddress
import socket
import struct
import sys


def resolve(host):
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)]
    except OSError:
        return []


def route_source(ip):  # a UDP "connect" only picks the route: nothing is sent
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def loopback(ip):
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def main(iface: str, fixed: str, peers: list[str]) -> str:
    resolved = {peer: resolve(peer) for peer in peers}
    if fixed:
        ip, how = fixed, "RAY_NODE_IP_ADDRESS"
    elif iface:
        how = f"RAY_IFACE={iface}"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # SIOCGIFADDR
                ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface.encode()[:15]))[20:24])
        except OSError as e:
            sys.exit(f"ray_cluster.sh: {socket.gethostname()}: no IPv4 address on RAY_IFACE={iface}: {e}")
    else:
        targets = [(ip, f"route to {peer}") for peer, ips in resolved.items() for ip in ips]
        targets.sort(key=lambda target: loopback(target[0]))  # peers off this host first
        targets += [("8.8.8.8", "default route"), ("2001:4860:4860::8888", "default route")]  # Ray's default
        ip, how = next(((src, how) for dst, how in targets if (src := route_source(dst))), (None, None))
        if ip is None:
            try:
                ip, how = socket.gethostbyname(socket.gethostname()), "host name"
            except OSError:
                ip, how = "127.0.0.1", "no network"
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        sys.exit(f"ray_cluster.sh: {socket.gethostname()}: {ip!r} ({how}) is not an IP address")
    if loopback(ip):
        outside = [peer for peer, ips in resolved.items() if not ips or not all(map(loopback, ips))]
        if outside:
            sys.exit(
                f"ray_cluster.sh: {socket.gethostname()}: its address {ip} ({how}) is a loopback address, which Ray"
                f" nodes on {', '.join(outside)} cannot reach; set RAY_IFACE to the interface of the cluster's"
                " network (or RAY_NODE_IP_ADDRESS to the head's address)"
            )
    return ip


if __name__ == "__main__":
    print(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
