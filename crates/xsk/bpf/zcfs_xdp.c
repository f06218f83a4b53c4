// SPDX-License-Identifier: (MIT OR Apache-2.0) AND GPL-2.0-only
// zcfs's XDP program: frames of zcfs's EtherTypes (0x88B5 data, 0x88B6 command) go to the
// AF_XDP socket registered for the queue they arrived on; everything else (IP, ARP, ...)
// passes to the kernel's stack untouched. Built by build.rs with
// `clang -O2 -g -target bpf -c`; self-contained (no libbpf headers needed).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

// From linux/bpf.h.
enum { XDP_ABORTED = 0, XDP_DROP = 1, XDP_PASS = 2 };
#define BPF_MAP_TYPE_XSKMAP 17
struct xdp_md {
    __u32 data;
    __u32 data_end;
    __u32 data_meta;
    __u32 ingress_ifindex;
    __u32 rx_queue_index;
    __u32 egress_ifindex;
};
// Helper 51: long bpf_redirect_map(void *map, __u64 key, __u64 flags); the low bits of
// flags are the action when the key has no socket.
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

// Must match XSKMAP_ENTRIES in src/xdp.rs: one entry per queue.
#define XSKMAP_ENTRIES 64

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, XSKMAP_ENTRIES);
    __type(key, __u32);
    __type(value, __u32);
} zcfs_xsks SEC(".maps");

#define ETH_HLEN 14
// The EtherTypes in network byte order, as they sit in the frame (little-endian load).
#define ETHERTYPE_DATA_BE 0xB588
#define ETHERTYPE_COMMAND_BE 0xB688
// The longest frame of zcfs's protocol (zcfs_l2::MAX_FRAME_LEN). A receiver lands frames
// in place and leaves only that much room behind its last receive slot, so a longer
// frame (a link whose MTU is larger, a VLAN tag's allowance, a neighbour's forgery)
// could write past an extent into the bytes behind it: another file's block on a
// server that lands writes in its volume (review 28). Dropped here, before any socket.
#define MAX_FRAME_LEN 1514

SEC("xdp")
int zcfs_xdp(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    if (data + ETH_HLEN > data_end)
        return XDP_PASS;
    __u16 proto = *(__u16 *)(data + 12);
    if (proto == ETHERTYPE_DATA_BE || proto == ETHERTYPE_COMMAND_BE) {
        if (data + MAX_FRAME_LEN < data_end)
            return XDP_DROP;
        // A zcfs frame on a queue without a socket is dropped: the stack has no use for it.
        return bpf_redirect_map(&zcfs_xsks, ctx->rx_queue_index, XDP_DROP);
    }
    return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
