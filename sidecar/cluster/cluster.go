// Package cluster shares the limiter's counters between sidecars: membership with
// hashicorp/memberlist, and state-based replication of each counter as a G-counter with
// one slot per node, so that a limit holds across nodes without a shared store.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/traffic"
)

// Config configures a node.
type Config struct {
	// NodeName is unique in the cluster; default "<hostname>-<bind port>".
	NodeName string
	// BindAddr is the host:port memberlist listens on (UDP and TCP).
	BindAddr string
	// AdvertiseAddr is the host:port other nodes reach this one at; default BindAddr.
	AdvertiseAddr string
	// Strategy is "static" (Join) or "dns" (DNSName).
	Strategy string
	// Join lists peers' host:port; it may name this node too.
	Join []string
	// DNSName is resolved every DNSInterval; its A and AAAA records are peers on the
	// bind port (a Kubernetes headless service).
	DNSName     string
	DNSInterval time.Duration
	// SecretKey (16, 24 or 32 bytes) encrypts cluster traffic; nil sends it in clear.
	SecretKey []byte
	// SyncInterval is how often changed counters are sent to the other nodes.
	SyncInterval time.Duration
	// ShareMode divides each counter's limit among the nodes counting it (share.go).
	ShareMode bool
	// GrantWait is how long a check refused by its share-mode bound below the limit
	// waits for the key's owner to grant room (grant.go): DefaultGrantWait when zero;
	// negative, no node asks.
	GrantWait time.Duration
	// GrantMaxLimit is the largest limit, in hits per window, whose counters the grants
	// divide (DefaultGrantMaxLimit when zero); share mode alone divides larger ones.
	// The members announce it, and each uses the smallest.
	GrantMaxLimit uint32
	// Broadcast sends every value to every member, as releases before owner replication
	// did (relay.go), rather than to the key's owner. A member that does so (or does not
	// know owner replication) makes every member broadcast.
	Broadcast bool
	// PushPullInterval is how often memberlist exchanges full state with a random peer
	// (30 s when zero).
	PushPullInterval time.Duration
	// Traffic, when set, gets the minute counts the other nodes report and the keys
	// they count: the console's merged view (traffic.go). RefreshView asks the others
	// for their minute counts at most once per TrafficInterval (DefaultTrafficInterval
	// when zero); members of earlier releases are sent them every TrafficInterval.
	Traffic         *traffic.Recorder
	TrafficInterval time.Duration
	// Now is the wall clock (time.Now when nil).
	Now      func() time.Time
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Bounds of the traffic.
const (
	// maxPacket keeps a sync message, with memberlist's framing and encryption, inside
	// one UDP packet of memberlist's default 1400-byte buffer.
	maxPacket = 1200
	// maxState bounds a state transfer below memberlist's 20 MB limit.
	maxState = 16 << 20
	// firstJoinWait bounds how long Start waits for the first join and its state
	// transfer before the node serves.
	firstJoinWait = 3 * time.Second
)

// Cluster is a running node.
type Cluster struct {
	cfg    Config
	lim    *limiter.Limiter
	ml     *memberlist.Memberlist
	origin string
	rep    *replicator
	slots  *slots
	m      *metrics
	log    *slog.Logger

	newestSentAt atomic.Int64
	joined       atomic.Bool
	// created is set once c.ml is: a member may join while memberlist.Create runs.
	created atomic.Bool
	// leaving is set once Stop has begun handing this node's keys over: it answers no
	// more requests for room. handedOff holds the members it has handed them over to
	// (as keys, by name): it forwards them the requests for room of the keys they own
	// next.
	leaving   atomic.Bool
	handedOff sync.Map
	stop      chan struct{}
	wg        sync.WaitGroup
	stopOnce  sync.Once
	firstJoin chan struct{} // closed after the first join attempt

	membersMu sync.Mutex
	members   map[string]memberlist.Node // live members, copied in the events
	gone      map[string]struct{}        // members that left or were declared dead

	peersMu    sync.Mutex
	peerStates map[string]*peerState // by member name (traffic.go)

	ownersMu sync.Mutex
	owners   owners // the keys' owners (grant.go), made again on membership events
	asksOut  outbox // requests for room waiting to go in a bundle (bundle.go)

	viewMu     sync.Mutex
	viewRound  *viewRound       // the live view's last round of queries (traffic.go)
	answeredAt map[string]int64 // when each member's query was last answered

	// inbox holds the sync and live-view messages received, merged in order by
	// inboxLoop, so that memberlist's handler, which hands over the grants' requests
	// and answers too, is never held up behind merges (nil: merged as they come).
	inbox chan []byte
}

// Start joins (or founds) the cluster and starts replicating lim's counters.
func Start(cfg Config, lim *limiter.Limiter) (*Cluster, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.DNSInterval <= 0 {
		cfg.DNSInterval = 10 * time.Second
	}
	if cfg.TrafficInterval <= 0 {
		cfg.TrafficInterval = DefaultTrafficInterval
	}
	bindHost, bindPort, err := splitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("CLUSTER_BIND_ADDR: %w", err)
	}
	if cfg.NodeName == "" {
		host, _ := os.Hostname()
		cfg.NodeName = fmt.Sprintf("%s-%d", host, bindPort)
	}
	var inc [8]byte
	if _, err := rand.Read(inc[:]); err != nil {
		return nil, err
	}
	c := &Cluster{
		cfg:       cfg,
		lim:       lim,
		origin:    cfg.NodeName + "#" + hex.EncodeToString(inc[:]),
		log:       cfg.Logger.With("node", cfg.NodeName),
		stop:      make(chan struct{}),
		firstJoin: make(chan struct{}),
		gone:      map[string]struct{}{},
		members:   map[string]memberlist.Node{},
	}
	c.rep = newReplicator(lim, c.origin, cfg.ShareMode)
	if cfg.Traffic != nil {
		c.rep.merged = c.offerBusy
	}
	c.slots = c.rep.slots
	c.m = newMetrics(cfg.Registry, c.newestAge)
	if cfg.GrantWait == 0 {
		c.cfg.GrantWait = DefaultGrantWait
	}
	if cfg.GrantMaxLimit == 0 {
		c.cfg.GrantMaxLimit = DefaultGrantMaxLimit
	}
	if c.grantsOn() {
		// Without the grants nothing needs memberlist's handler free, and merging
		// inline keeps the order and timing of merges as they were.
		c.inbox = make(chan []byte, inboxDepth)
	}
	c.owners = newOwners(cfg.NodeName, c.nowMS(), max(cfg.SyncInterval.Milliseconds(), 1), max(c.cfg.GrantWait.Milliseconds(), 0))
	c.owners.maxLimit = c.cfg.GrantMaxLimit
	if cfg.ShareMode && c.cfg.GrantWait > 0 {
		lim.OnBoundRefused(c.askRoom)
	}
	if !cfg.Broadcast {
		lim.OnUnknown(func(k limiter.Key, limit uint32, sizeMS, endMS int64) {
			c.rep.unknown(k, limit, sizeMS, endMS, c.shareEnv(c.nowMS()))
		})
	}

	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	mc.BindAddr, mc.BindPort = bindHost, bindPort
	if cfg.AdvertiseAddr != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitHostPort(cfg.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("CLUSTER_ADVERTISE_ADDR: %w", err)
		}
	}
	if cfg.PushPullInterval > 0 {
		mc.PushPullInterval = cfg.PushPullInterval
	}
	mc.Delegate = (*delegate)(c)
	mc.Events = (*events)(c)
	mc.SecretKey = cfg.SecretKey
	// Sync messages are compressed once per flush (compress.go), not by memberlist for
	// every packet and member; its own probes and gossip are small.
	mc.EnableCompression = false
	mc.Logger = log.New(&logWriter{log: c.log}, "", 0)
	tr, err := newCountingTransport(bindHost, bindPort, mc.Logger, c.m)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if bindPort == 0 {
		mc.BindPort, mc.AdvertisePort = tr.GetAutoBindPort(), tr.GetAutoBindPort()
	}
	mc.Transport = tr
	if c.ml, err = memberlist.Create(mc); err != nil {
		_ = tr.Shutdown()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c.created.Store(true)
	c.log.Info("cluster node started", "bind", cfg.BindAddr, "origin", c.origin,
		"strategy", cfg.Strategy, "encrypted", len(cfg.SecretKey) > 0, "sync_interval", cfg.SyncInterval, "share_mode", cfg.ShareMode)

	c.wg.Go(c.syncLoop)
	if c.inbox != nil {
		c.wg.Go(c.inboxLoop)
	}
	if cfg.Traffic != nil {
		c.wg.Go(c.trafficLoop)
	}
	switch cfg.Strategy {
	case "static":
		c.wg.Go(c.joinStatic)
	case "dns":
		c.wg.Go(c.joinDNS)
	default:
		close(c.firstJoin)
	}
	// A node that serves before its first join would count from zero what the others
	// have already counted in the current windows: wait for the join's state transfer,
	// at most firstJoinWait (peers that do not answer, such as the first node of a
	// cluster, must not keep it from serving).
	select {
	case <-c.firstJoin:
	case <-time.After(firstJoinWait):
		c.log.Warn("serving before the first join finished", "waited", firstJoinWait)
	}
	return c, nil
}

// Settling reports whether this node, new to the cluster, does not answer for the keys
// it owns yet (owners.owns: until the bounds the others held of them have reached it or
// lapsed, a few sync intervals after its start). Meanwhile the members that ask it for
// room of a small limit take only their part of it, so the sidecar reports itself not
// ready until it has settled.
func (c *Cluster) Settling() bool {
	c.ownersMu.Lock()
	defer c.ownersMu.Unlock()
	return c.grantsOn() && c.nowMS() < c.owners.startedAt+c.owners.settleStart
}

// Members returns the number of live members, this node included.
func (c *Cluster) Members() int { return c.ml.NumMembers() }

// MemberNames returns the names of the live members.
func (c *Cluster) MemberNames() []string {
	var names []string
	for _, n := range c.ml.Members() {
		names = append(names, n.Name)
	}
	return names
}

// peers returns the other live members. memberlist's Members returns its own nodes,
// whose address it rewrites under its lock on every alive message, so reading them
// outside that lock is a data race: these are copies made in the join and leave events,
// which memberlist calls under its lock.
func (c *Cluster) peers() []memberlist.Node {
	c.membersMu.Lock()
	defer c.membersMu.Unlock()
	out := make([]memberlist.Node, 0, len(c.members))
	for name, n := range c.members {
		if name != c.cfg.NodeName {
			out = append(out, n)
		}
	}
	return out
}

// Origin is this node's slot name: its node name and a random incarnation.
func (c *Cluster) Origin() string { return c.origin }

func (c *Cluster) nowMS() int64 { return c.cfg.Now().UnixMilli() }

func (c *Cluster) newestAge() float64 {
	t := c.newestSentAt.Load()
	if t == 0 {
		return -1
	}
	return float64(c.nowMS()-t) / 1000
}

// joinStatic joins the configured peers, retrying until one answers (meanwhile this
// node serves on its own), and then keeps joining those that are not live members:
// memberlist forgets a dead member 30 s after it died and never contacts it again, so
// a peer that was down at our join, or a netsplit longer than that, would otherwise
// leave the cluster apart for good.
func (c *Cluster) joinStatic() {
	peers := c.others(c.cfg.Join)
	if len(peers) == 0 {
		c.log.Info("no other peer configured: serving as a cluster of one")
		close(c.firstJoin)
		return
	}
	delay := 500 * time.Millisecond
	first := true
	for {
		if missing := c.missing(peers); len(missing) > 0 {
			n, err := c.ml.Join(missing)
			switch {
			case n > 0 && !c.joined.Swap(true):
				c.log.Info("joined the cluster", "contacted", n, "members", c.ml.NumMembers())
			case n > 0:
				c.log.Info("joined configured peers that were not members", "contacted", n, "members", c.ml.NumMembers())
			case !c.joined.Load():
				c.log.Debug("no peer answered yet; serving on our own and retrying", "peers", missing, "error", err, "retry_in", delay)
			default:
				c.log.Debug("configured peers that are not members did not answer", "peers", missing, "error", err)
			}
		}
		if first {
			close(c.firstJoin)
			first = false
		}
		select {
		case <-c.stop:
			return
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// missing returns the peers that are not the address of a live member.
func (c *Cluster) missing(peers []string) []string {
	live := map[string]bool{}
	for _, n := range c.peers() {
		live[n.Address()] = true
	}
	var out []string
	for _, p := range peers {
		if host, port, err := splitHostPort(p); err != nil || !live[net.JoinHostPort(host, strconv.Itoa(port))] {
			out = append(out, p)
		}
	}
	return out
}

// joinDNS resolves the DNS name periodically and joins the addresses that are not
// members yet, so that new pods of a headless service are found.
func (c *Cluster) joinDNS() {
	_, port, _ := splitHostPort(c.cfg.BindAddr)
	t := time.NewTicker(c.cfg.DNSInterval)
	defer t.Stop()
	first := true
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, c.cfg.DNSName)
		cancel()
		if err != nil {
			c.log.Warn("resolving CLUSTER_DNS_NAME", "name", c.cfg.DNSName, "error", err)
		} else {
			known := map[string]bool{}
			for _, n := range c.peers() {
				known[n.Address()] = true
			}
			var targets []string
			for _, a := range addrs {
				hp := net.JoinHostPort(a, strconv.Itoa(port))
				if !known[hp] {
					targets = append(targets, hp)
				}
			}
			if targets = c.others(targets); len(targets) > 0 {
				if n, err := c.ml.Join(targets); n > 0 {
					c.joined.Store(true)
					c.log.Info("joined peers found in DNS", "contacted", n, "members", c.ml.NumMembers())
				} else {
					c.log.Debug("no peer found in DNS answered", "targets", targets, "error", err)
				}
			}
		}
		if first {
			close(c.firstJoin)
			first = false
		}
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
	}
}

// others drops this node's own address from a peer list, so that one list can name
// every member.
func (c *Cluster) others(peers []string) []string {
	self := c.ml.LocalNode()
	selfIPs := map[string]bool{self.Addr.String(): true}
	if host, _, err := splitHostPort(c.cfg.BindAddr); err == nil {
		selfIPs[host] = true
	}
	var out []string
	for _, p := range peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			continue
		}
		if port == strconv.Itoa(int(self.Port)) {
			ips, _ := net.LookupHost(host)
			isSelf := false
			for _, ip := range ips {
				if selfIPs[ip] || (net.ParseIP(ip).IsLoopback() && net.ParseIP(self.Addr.String()).IsLoopback()) {
					isSelf = true
				}
			}
			if isSelf {
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// syncLoop sends, every sync interval, this node's own count of every counter that
// changed (and of those sent in the previous flush, once more, so that one lost
// packet is healed at once) to every other live member.
func (c *Cluster) syncLoop() {
	t := time.NewTicker(c.cfg.SyncInterval)
	defer t.Stop()
	lastSweep := c.nowMS()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := c.nowMS()
		c.flush(now)
		if now-lastSweep >= 1000 {
			c.slots.sweep(now)
			lastSweep = now
		}
	}
}

func (c *Cluster) flush(now int64) {
	env := c.shareEnv(now)
	res := c.rep.flush(env)
	if len(res.values) > 0 {
		c.m.keysPerFlush.Observe(float64(len(res.values)))
	}
	if c.cfg.ShareMode {
		c.m.capped.Add(float64(res.capped))
	}
	if env.relay {
		c.sendRelayed(now, env, res)
		return
	}
	if len(res.values) == 0 {
		return
	}
	// The newest version each member announces, encoded once per flush for all of them:
	// 3 (compressed), 2 (with share mode's fields), else 1.
	msgs := map[byte][][]byte{}
	for _, n := range c.peers() {
		ver := version1
		if len(n.Meta) > 0 {
			ver = min(max(n.Meta[0], version1), version)
		}
		if msgs[ver] == nil {
			if ver == version3 {
				msgs[ver] = pack3(now, c.origin, res.values)
			} else {
				p := newPacker(now, c.origin, maxPacket)
				if ver == version2 {
					p = newPacker2(now, c.origin, maxPacket)
				}
				for _, v := range res.values {
					p.add(v)
				}
				msgs[ver] = p.messages()
			}
		}
		for _, msg := range msgs[ver] {
			c.send(&n, kindValues, msg)
		}
	}
}

// sendRelayed sends what a flush in owner replication has for each member
// (relayedPackets), in as few packets as they fit (sync bundles, bundle.go) to a member
// that reads them.
func (c *Cluster) sendRelayed(now int64, env shareEnv, res flushResult) {
	byName := relayedPackets(now, c.origin, env, res)
	c.membersMu.Lock()
	nodes := make(map[string]memberlist.Node, len(byName))
	for name := range byName {
		if n, ok := c.members[name]; ok && name != c.cfg.NodeName {
			nodes[name] = n
		}
	}
	c.membersMu.Unlock()
	for name, msgs := range byName {
		n, ok := nodes[name]
		if !ok {
			continue
		}
		if takesSyncBundles(n.Meta) {
			msgs = packBundles(syncBundleKind, msgs)
		}
		for _, m := range msgs {
			c.send(&n, syncKindOf(m[0]), m)
		}
	}
}

// syncKindOf is the metrics' kind of a message sendRelayed sends, by its first byte.
func syncKindOf(b byte) string {
	switch b {
	case syncBundleKind:
		return kindBundle
	case summaryKind:
		return kindSummary
	case relayKind:
		return kindRelay
	}
	return kindValues
}

// send hands msg to memberlist for n (best effort: one UDP packet) and counts it by kind.
func (c *Cluster) send(n *memberlist.Node, kind string, msg []byte) bool {
	if err := c.ml.SendBestEffort(n, msg); err != nil {
		c.m.sendErrors.Inc()
		return false
	}
	c.m.kindMsgs.WithLabelValues(kind).Inc()
	c.m.kindBytes.WithLabelValues(kind).Add(float64(len(msg)))
	return true
}

// shareEnv is share mode's view of the membership at time now.
func (c *Cluster) shareEnv(now int64) shareEnv {
	c.ownersMu.Lock()
	o := c.owners
	c.ownersMu.Unlock()
	c.membersMu.Lock()
	live := make(map[string]bool, len(c.members))
	for name := range c.members {
		// A member that handed its keys over to leave counts no more (handover.go):
		// what it counted is all it holds, though its Leave has not come yet.
		live[name] = name != c.cfg.NodeName && !o.handedToLeave(name, now)
	}
	c.membersMu.Unlock()
	env := shareEnv{
		now: now, intervalMS: max(c.cfg.SyncInterval.Milliseconds(), 1),
		live: func(name string) bool { return live[name] }, members: max(len(live), 1),
	}
	if len(o.leftOrigins) > 0 {
		env.left = o.originLeft
	}
	env.self, env.waitMS = c.cfg.NodeName, max(c.cfg.GrantWait.Milliseconds(), 0)
	if o.names != nil {
		env.grants, env.grantMax, env.relay, env.names = o.grants, o.maxLimit, o.relay, o.names
		env.owns = func(k limiter.Key) bool { return o.owns(c.lim.BucketName(k.Bucket), k.ID, now) }
		// Read when a request for room is answered: a handover made since this env was
		// taken ends the answering at once (handover.go).
		env.handing = func(k limiter.Key) bool {
			c.ownersMu.Lock()
			defer c.ownersMu.Unlock()
			return c.owners.handing(c.lim.BucketName(k.Bucket), k.ID, now)
		}
	}
	return env
}

// grantsOn says this node asks and answers grants.
func (c *Cluster) grantsOn() bool { return c.cfg.ShareMode && c.cfg.GrantWait > 0 }

// updateOwners makes the owners again from the live members (the caller holds
// membersMu): grants are on when every live member announces them, this node included,
// for the limits up to the smallest GrantMaxLimit announced; owner replication when
// every live member announces it. A member that handed its keys over to leave owns none
// from then on, for leaveTimeout at most (receiveHandover).
func (c *Cluster) updateOwners() {
	var names []string
	grants, relay := c.grantsOn(), !c.cfg.Broadcast
	maxLimit := c.cfg.GrantMaxLimit
	c.ownersMu.Lock()
	left := owners{leftAfterHandover: c.owners.leftAfterHandover} // never changed in place
	c.ownersMu.Unlock()
	now := c.nowMS()
	for name, n := range c.members {
		if len(n.Meta) < 2 || n.Meta[1]&featureGrants == 0 {
			grants = false
		}
		if len(n.Meta) < 2 || n.Meta[1]&featureRelay == 0 || n.Meta[0] < version3 {
			relay = false
		}
		maxLimit = min(maxLimit, announcedGrantMax(n.Meta))
		if left.handedToLeave(name, now) {
			// It handed its keys over to leave: the next owners answer for them from
			// now on, though its Leave has not reached this node yet (handover.go).
			continue
		}
		names = append(names, name)
	}
	if !grants && !relay {
		names = nil
	} else {
		names = sortedNames(names)
	}
	c.ownersMu.Lock()
	defer c.ownersMu.Unlock()
	c.owners.maxLimit = maxLimit
	if grants != c.owners.grants || relay != c.owners.relay {
		c.log.Info("owners of keys", "grants", grants, "owner_replication", relay, "members", len(c.members))
	}
	if !slices.Equal(names, c.owners.names) || (names == nil) != (c.owners.names == nil) || grants != c.owners.grants || relay != c.owners.relay {
		if relay {
			c.noteJoiners(c.owners.names, names, now)
		}
		c.owners.prev, c.owners.names, c.owners.changedAt = c.owners.names, names, now
		c.owners.grants, c.owners.relay = grants, relay
	}
}

// noteJoiners notes the members in names that were not in before, to hand them at once
// the keys this node answered for (handover.go): with what it knows of them if it had
// settled by now, else with nothing (it answered for none). The caller holds ownersMu.
func (c *Cluster) noteJoiners(before, names []string, now int64) {
	o := &c.owners
	if o.joiners == nil {
		o.joiners = map[string]joiner{}
	}
	hands := now >= o.startedAt+o.settleStart
	added := false
	for _, n := range names {
		if n != c.cfg.NodeName && !slices.Contains(before, n) && len(o.joiners) < maxGone {
			o.joiners[n] = joiner{at: now, hands: hands}
			added = true
		}
	}
	if added {
		time.AfterFunc(0, c.sendHandovers)
	}
}

// askRoom is told of n hits of k that share mode's bound refused below the limit: it
// asks the key's owner for room and waits for the answer, at most GrantWait (grant.go)
// and never past by (when not zero: the check's decision is due then), and reports
// whether the bound rose.
func (c *Cluster) askRoom(k limiter.Key, n uint32, sizeMS, endMS int64, by time.Time) bool {
	// The caller may reuse the id's bytes once the check returns; the request outlives it.
	k.ID = strings.Clone(k.ID)
	now := c.nowMS()
	env := c.shareEnv(now)
	if snap, ok := c.lim.Lookup(k); !ok || !env.grantsFor(int64(snap.Limit)) {
		return false
	}
	bucket := c.lim.BucketName(k.Bucket)
	c.ownersMu.Lock()
	owner := ownerOf(bucket, k.ID, c.owners.names)
	if to := c.owners.forwardTo(bucket, k.ID, now); to != "" {
		// The owner, not settled: the member that owned the key before answers.
		owner = to
	}
	c.ownersMu.Unlock()
	if owner == c.cfg.NodeName || (env.handing != nil && env.handing(k)) {
		g := c.rep.grantSelf(k, n, endMS, env)
		c.noteGrant("self", g)
		if g > 0 && owner != c.cfg.NodeName {
			// Granted for the key's new owner (handing): it learns of the bound at once,
			// as of a grant to another member, rather than with this node's next flush.
			c.handOwnBound(k, owner, sizeMS, endMS, now)
		}
		return g > 0
	}
	c.membersMu.Lock()
	node, ok := c.members[owner]
	c.membersMu.Unlock()
	if !ok {
		return false
	}
	waitMS := max(c.cfg.GrantWait.Milliseconds(), 1)
	if !by.IsZero() {
		left := time.Until(by).Milliseconds()
		if left < 1 {
			return false // no time left to wait for an answer
		}
		waitMS = min(waitMS, left)
	}
	a, first, ok := c.rep.asks.start(k, sizeMS, endMS, now, waitMS)
	if !ok {
		return false
	}
	if first {
		q := c.rep.request(k, a, n, now, waitMS)
		if !c.sendAsk(&node, encodeAsk(q)) {
			c.rep.asks.end(k, a, 0)
			return false
		}
		c.m.grants.WithLabelValues("asked", "sent").Inc()
	}
	// The check that sent the request waits until its deadline; the others until it
	// has ended the request (answered, or not in time), so that they see what it did.
	wait := time.Duration(a.deadline-now) * time.Millisecond
	if !first {
		wait += fallBackGrace
	}
	if !by.IsZero() {
		wait = min(wait, time.Until(by))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-a.done:
	case <-t.C:
	case <-c.stop:
	}
	granted, answered := c.rep.asks.result(a)
	if first && !answered {
		c.m.grants.WithLabelValues("asked", "timed_out").Inc()
		if c.rep.fallBack(k, a, endMS, c.shareEnv(c.nowMS())) {
			c.m.grants.WithLabelValues("asked", "took_part").Inc()
			granted = true
		} else {
			// The answer may have come meanwhile, after the wait (a busy machine).
			granted, _ = c.rep.asks.result(a)
		}
		c.rep.asks.end(k, a, 0)
	}
	return granted
}

// handOwnBound sends k's value in the window of sizeMS ending at endMS, with its bound, to
// the member named owner, the key's new owner, which this node answers for (handing), as
// its flush would send it.
func (c *Cluster) handOwnBound(k limiter.Key, owner string, sizeMS, endMS, now int64) {
	c.membersMu.Lock()
	node, ok := c.members[owner]
	c.membersMu.Unlock()
	v, held := c.rep.ownValue(k, sizeMS, endMS)
	if !ok || !held {
		return
	}
	for _, msg := range pack3(now, c.origin, []value{v}) {
		c.send(&node, kindValues, msg)
	}
}

// fallBackGrace is how much longer than the request's deadline the checks that did not
// send it wait for the one that did to end it.
const fallBackGrace = 5 * time.Millisecond

// noteGrant counts a grant this node made as the owner (to another node, or to itself).
func (c *Cluster) noteGrant(to string, g uint32) {
	result := "zero"
	if g > 0 {
		result = "granted"
		c.m.grantedHits.WithLabelValues(to).Add(float64(g))
	}
	c.m.grants.WithLabelValues("answered_"+to, result).Inc()
}

// receiveAsk answers another node's request for room, as the key's owner.
func (c *Cluster) receiveAsk(b []byte) {
	if n, ans, ok := c.answerAsk(b); ok {
		c.send(&n, kindAnswer, ans)
	}
}

// answerAsk returns the answer to another node's request for room, as the key's owner,
// and the asker to send it to (ok false: none to send). In owner replication an owner
// that has not settled forwards the request to the member that owned the key before it,
// which answers, and tells it what it granted.
func (c *Cluster) answerAsk(b []byte) (to memberlist.Node, answer []byte, ok bool) {
	q, err := decodeAsk(b)
	if err != nil {
		c.m.malformed.Inc()
		return to, nil, false
	}
	name, _, _ := strings.Cut(q.origin, "#")
	now := c.nowMS()
	c.m.askLag.Observe(float64(max(now-q.sentAt, 0)) / 1000)
	c.membersMu.Lock()
	node, ok := c.members[name]
	c.ownersMu.Lock()
	o := c.owners
	c.ownersMu.Unlock()
	forward := o.forwardTo(q.v.bucket, q.v.id, now)
	prev, forwarding := c.members[forward]
	c.membersMu.Unlock()
	if !ok || name == c.cfg.NodeName {
		return to, nil, false
	}
	if c.leaving.Load() {
		// Handed over, the key's next owner answers (receiveHandover); before, nobody.
		if next := c.ownerWithout(q.v.bucket, q.v.id, o.names, c.cfg.NodeName); o.relay && next != name {
			c.membersMu.Lock()
			n, ok := c.members[next]
			c.membersMu.Unlock()
			if _, handed := c.handedOff.Load(next); ok && handed {
				c.send(&n, kindAsk, b)
			}
		}
		return to, nil, false
	}
	if forwarding && forward != c.cfg.NodeName && forward != name {
		c.send(&prev, kindAsk, b)
		return to, nil, false
	}
	env := c.shareEnv(now)
	ans, ok := c.rep.grant(q, env)
	if !ok {
		return to, nil, false
	}
	c.noteGrant("other", ans.grant)
	if owner := env.ownerOf(q.v.bucket, q.v.id); env.relay && ans.grant > 0 && owner != c.cfg.NodeName {
		// Answered for the key's new owner (handing): it learns of the grant at once.
		c.membersMu.Lock()
		n, ok := c.members[owner]
		c.membersMu.Unlock()
		if ok {
			for _, msg := range packRelayShare(q.sentAt, q.origin, handedGrant(q, ans.grant)) {
				c.send(&n, kindRelay, msg)
			}
		}
	}
	return node, encodeAnswer(ans), true
}

// receiveAnswer applies an owner's answer to this node's request.
func (c *Cluster) receiveAnswer(b []byte) {
	ans, err := decodeAnswer(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	now := c.nowMS()
	c.rep.heard(nodeName(ans.origin)) // an owner that answers is not silent
	a, applied, late := c.rep.answer(ans, now, max(c.cfg.SyncInterval.Milliseconds(), 1))
	if a != nil {
		c.m.askRTT.Observe(float64(max(now-a.sentAt, 0)) / 1000)
	}
	switch {
	case a == nil:
	case late:
		c.m.grants.WithLabelValues("asked", "late").Inc()
		if applied {
			c.m.grants.WithLabelValues("asked", "late_applied").Inc()
		}
	case applied:
		c.m.grants.WithLabelValues("asked", "granted").Inc()
	case ans.grant == 0:
		c.m.grants.WithLabelValues("asked", "zero").Inc()
	default:
		c.m.grants.WithLabelValues("asked", "late").Inc()
	}
}

// receive merges a sync message (direct) or one message of a state transfer.
func (c *Cluster) receive(m message, direct bool) (dropped int) {
	if m.origin == c.origin {
		return 0
	}
	if m.sentAt > c.newestSentAt.Load() {
		c.newestSentAt.Store(m.sentAt)
	}
	dropped = c.rep.receive(m, direct, c.nowMS())
	c.m.stale.Add(float64(dropped))
	if dropped > 0 {
		c.noteStale(m.origin, dropped)
	}
	return dropped
}

// DebugCounter is what the debug endpoint shows of one counter.
type DebugCounter struct {
	Bucket      string `json:"bucket"`
	Key         string `json:"key"`
	Origin      string `json:"origin"`
	Own         uint32 `json:"own"`
	Remote      uint32 `json:"remote"`
	Limit       uint32 `json:"limit"`
	WindowMS    int64  `json:"window_ms"`
	WindowEndMS int64  `json:"window_end_ms"`
	// Share mode: the hits this node's bound refused in the window, and its bounds in
	// the window and the next (absent: none).
	Refused   uint32     `json:"refused"`
	Bound     *uint32    `json:"share_bound,omitempty"`
	NextBound *uint32    `json:"share_bound_next,omitempty"`
	Slots     []SlotView `json:"slots"`
	Members   []string   `json:"members"`
	// Owner is the member that owns the key (grant.go, relay.go): it grants the part of
	// the limit nobody holds, and in owner replication it gets every member's values and
	// sends each its summary; absent while neither runs. Replication is "owner" or
	// "broadcast" (every value to every member). OwnerOthers is the others' count of
	// the key as its owner last reported it to this node (absent: none this window).
	Owner       string  `json:"owner,omitempty"`
	Replication string  `json:"replication"`
	OwnerOthers *uint32 `json:"owner_others,omitempty"`
}

// Debug returns one counter's state: this node's count and every remote slot.
func (c *Cluster) Debug(bucket, key string) DebugCounter {
	d := DebugCounter{Bucket: bucket, Key: key, Origin: c.origin, Members: c.MemberNames(), Slots: []SlotView{}}
	// The owner follows from the names alone: a key nobody counted yet has one too.
	c.ownersMu.Lock()
	d.Replication = "broadcast"
	if c.owners.relay {
		d.Replication = "owner"
	}
	if c.owners.names != nil {
		d.Owner = ownerOf(bucket, key, c.owners.names)
	}
	c.ownersMu.Unlock()
	b, ok := c.lim.LookupBucket(bucket)
	if !ok {
		return d
	}
	k := limiter.Key{Bucket: b, ID: key}
	if s, ok := c.lim.Lookup(k); ok {
		d.Own, d.Remote, d.Limit, d.WindowMS, d.WindowEndMS, d.Refused = s.Own, s.Remote, s.Limit, s.SizeMS, s.EndMS, s.Refused
		if b, ok := c.lim.CapIn(k, s.SizeMS, s.EndMS); ok {
			d.Bound = &b
		}
		if b, ok := c.lim.CapIn(k, s.SizeMS, s.EndMS+s.SizeMS); ok {
			d.NextBound = &b
		}
	}
	if v := c.slots.view(k); v != nil {
		d.Slots = v
	}
	if others, ok := c.slots.aggIn(k, d.WindowMS, d.WindowEndMS); ok {
		d.OwnerOthers = &others
	}
	return d
}

// delegate is the Cluster as memberlist's Delegate.
type delegate Cluster

// NodeMeta announces the newest sync message version this node reads, whether it asks
// and answers grants, the largest limit it runs them for, and its incarnation (the
// part of its origin after its name).
func (d *delegate) NodeMeta(int) []byte {
	features := featureViewQuery
	if d.c().grantsOn() {
		features |= featureGrants | featureBundle
	}
	if !d.c().cfg.Broadcast {
		features |= featureRelay | featureHandover | featureSyncBundle
	}
	meta := binary.AppendUvarint([]byte{version, features}, uint64(d.c().cfg.GrantMaxLimit))
	return append(meta, d.c().origin[len(d.c().cfg.NodeName)+1:]...)
}

// metaGrantMax parses the grant limit of a member's metadata, after its version and
// features, and returns it with the bytes after it; ok is false when it has none.
func metaGrantMax(meta []byte) (v uint64, rest []byte, ok bool) {
	if len(meta) < 3 {
		return 0, nil, false
	}
	v, n := binary.Uvarint(meta[2:])
	if n <= 0 {
		return 0, nil, false
	}
	return v, meta[2+n:], true
}

// announcedOrigin is the origin of the member named that its metadata announces ("": it
// does not say, an earlier release).
func announcedOrigin(name string, meta []byte) string {
	_, inc, ok := metaGrantMax(meta)
	if !ok || len(inc) == 0 || len(inc) > 32 {
		return ""
	}
	if _, err := hex.DecodeString(string(inc)); err != nil {
		return ""
	}
	return name + "#" + string(inc)
}

// announcedGrantMax is the largest limit a member's metadata says it runs the grants
// for; a member that does not say (an earlier release) runs them for every limit.
func announcedGrantMax(meta []byte) uint32 {
	v, _, ok := metaGrantMax(meta)
	if !ok || v == 0 {
		return math.MaxUint32
	}
	return uint32(min(v, math.MaxUint32))
}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) c() *Cluster                     { return (*Cluster)(d) }
func (d *delegate) NotifyMsg(b []byte) {
	c := d.c()
	if len(b) > 0 {
		switch b[0] {
		case askKind:
			c.receiveAsk(b)
			return
		case answerKind:
			c.receiveAnswer(b)
			return
		case bundleKind:
			c.receiveBundle(b)
			return
		}
	}
	if c.inbox == nil {
		c.receiveMsg(b)
		return
	}
	// memberlist may reuse b once this returns.
	select {
	case c.inbox <- bytes.Clone(b):
	case <-c.stop:
	}
}

// inboxDepth bounds the messages waiting to be merged; a full inbox holds up
// memberlist's handler, as merging inline did.
const inboxDepth = 1024

// inboxLoop merges the messages of the inbox in the order they came.
func (c *Cluster) inboxLoop() {
	for {
		select {
		case b := <-c.inbox:
			c.receiveMsg(b)
		case <-c.stop:
			return
		}
	}
}

// receiveMsg merges a sync, owner replication or live-view message.
func (c *Cluster) receiveMsg(b []byte) {
	if len(b) > 0 {
		switch b[0] {
		case trafficKind:
			c.receiveTraffic(b)
			return
		case viewQueryKind:
			c.receiveViewQuery(b)
			return
		case summaryKind:
			c.receiveSummary(b)
			return
		case relayKind:
			c.receiveRelay(b)
			return
		case handoverKind:
			c.receiveHandover(b)
			return
		case busyKind:
			c.receiveBusy(b)
			return
		case syncBundleKind:
			msgs, err := decodeBundle(syncBundleKind, b)
			if err != nil {
				c.m.malformed.Inc()
				return
			}
			for _, m := range msgs {
				c.receiveMsg(m)
			}
			return
		}
	}
	m, err := decode(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	now := c.nowMS()
	c.m.mergeLag.Observe(float64(max(now-m.sentAt, 0)) / 1000)
	if m.origin == c.origin {
		return
	}
	c.heard(m.origin, m.sentAt, now)
	c.receive(m, true)
	// In owner replication, the owner of keys in a report answers it at once.
	env := c.shareEnv(c.nowMS())
	if es := c.rep.replies(m, env); len(es) > 0 {
		name := nodeName(m.origin)
		c.membersMu.Lock()
		n, ok := c.members[name]
		c.membersMu.Unlock()
		if ok && name != c.cfg.NodeName {
			for _, msg := range packSummaries(env.now, c.origin, env.raiseMS(), es) {
				c.send(&n, kindSummary, msg)
			}
		}
	}
}

// receiveSummary applies a key owner's summary (relay.go).
func (c *Cluster) receiveSummary(b []byte) {
	sum, err := decodeSummary(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	if sum.origin == c.origin {
		return
	}
	now := c.nowMS()
	c.m.mergeLag.Observe(float64(max(now-sum.sentAt, 0)) / 1000)
	if sum.sentAt > c.newestSentAt.Load() {
		c.newestSentAt.Store(sum.sentAt)
	}
	c.heard(sum.origin, sum.sentAt, now)
	c.rep.slots.sawDirect(sum.origin)
	if dropped := c.rep.applySummary(sum, c.shareEnv(now)); dropped > 0 {
		c.m.stale.Add(float64(dropped))
		c.noteStale(sum.origin, dropped)
	}
	if c.cfg.Traffic != nil {
		for _, e := range sum.entries {
			c.offerBusy(value{bucket: e.bucket, id: e.id, sizeMS: e.sizeMS, endMS: e.endMS})
		}
	}
}

// receiveRelay merges the counts of other origins relayed to this node as their keys'
// new owner (relay.go).
func (c *Cluster) receiveRelay(b []byte) {
	msgs, err := decodeRelay(b)
	if err != nil {
		c.m.malformed.Inc()
		return
	}
	for _, m := range msgs {
		c.receive(m, false)
	}
}

// LocalState is this node's whole view for a state transfer: its own counts and every
// remote slot of windows that have not ended, one message per origin.
func (d *delegate) LocalState(join bool) []byte {
	c := d.c()
	now := c.nowMS()
	packers := map[string]*packer{c.origin: newPacker(now, c.origin, maxState)}
	size := 0
	cut := false
	add := func(origin string, v value) {
		if size > maxState {
			cut = true
			return
		}
		p := packers[origin]
		if p == nil {
			p = newPacker(now, origin, maxState)
			packers[origin] = p
		}
		p.add(v)
		size += len(v.bucket) + len(v.id) + 16
	}
	c.lim.Each(func(k limiter.Key, s limiter.Snapshot) {
		if s.Own > 0 {
			add(c.origin, value{bucket: c.lim.BucketName(k.Bucket), id: k.ID, sizeMS: s.SizeMS, endMS: s.EndMS, count: s.Own})
		}
	})
	if join {
		// A join (a new or restarted node, or a member back after a netsplit) gets
		// every slot this node knows; a periodic push/pull only this node's own counts,
		// which heal what the other missed of them. Relaying every origin's slots every
		// 30 s made each node's push/pulls grow with N × keys (at N = 20 most of its
		// bytes), for counts the origins send themselves.
		c.slots.each(now, func(origin string, k limiter.Key, sl slot) {
			add(origin, value{bucket: c.lim.BucketName(k.Bucket), id: k.ID, sizeMS: sl.sizeMS, endMS: sl.endMS, count: sl.count})
		})
	}
	var state []byte
	for _, p := range packers {
		state = appendState(state, p.messages()...)
	}
	if cut {
		c.m.transferCut.Inc()
		c.log.Warn("state transfer cut at its size limit; the rest follows by sync", "limit_bytes", maxState)
	}
	c.m.transfers.WithLabelValues("sent", kind(join)).Inc()
	c.m.transferBytes.WithLabelValues("sent").Add(float64(len(state)))
	return state
}

func (d *delegate) MergeRemoteState(b []byte, join bool) {
	c := d.c()
	msgs, err := decodeState(b)
	if err != nil {
		c.m.malformed.Inc()
		c.log.Warn("malformed state transfer", "bytes", len(b))
		return
	}
	c.m.transfers.WithLabelValues("received", kind(join)).Inc()
	c.m.transferBytes.WithLabelValues("received").Add(float64(len(b)))
	values := 0
	for _, m := range msgs {
		c.receive(m, false)
		values += len(m.values)
	}
	if join {
		c.log.Info("state received on join", "values", values, "bytes", len(b))
	}
}

func kind(join bool) string {
	if join {
		return "join"
	}
	return "push_pull"
}

// events keeps the members gauge current, and exchanges state with a member that
// comes back after memberlist declared it dead (a healed netsplit): the values sent to
// it meanwhile were lost, and memberlist's own push/pull may be 30 s away.
type events Cluster

// maxGone bounds the names of departed members kept to notice their return.
const maxGone = 4096

// NotifyJoin is also called for this node, from memberlist.Create, before c.ml is set.
func (e *events) NotifyJoin(n *memberlist.Node) {
	c := (*Cluster)(e)
	c.m.members.Add(1)
	c.log.Info("member joined", "member", n.Name, "addr", n.Address())
	c.membersMu.Lock()
	c.members[n.Name] = copyNode(n)
	_, back := c.gone[n.Name]
	delete(c.gone, n.Name)
	c.noteIncarnation(n)
	c.ownersMu.Lock()
	c.owners.forgetLeave(n.Name)
	c.ownersMu.Unlock()
	c.updateOwners()
	c.membersMu.Unlock()
	if back {
		// Not from this callback: memberlist holds its lock while it calls it.
		name, addr := n.Name, n.Address()
		go func() {
			select {
			case <-c.stop:
				return
			default:
			}
			if _, err := c.ml.Join([]string{addr}); err != nil {
				c.log.Warn("exchanging state with a member that came back", "member", name, "error", err)
			}
		}()
	}
}

func (e *events) NotifyLeave(n *memberlist.Node) {
	c := (*Cluster)(e)
	c.m.members.Sub(1)
	c.log.Info("member left", "member", n.Name, "addr", n.Address())
	c.membersMu.Lock()
	delete(c.members, n.Name)
	if len(c.gone) >= maxGone {
		clear(c.gone)
	}
	c.gone[n.Name] = struct{}{}
	c.updateOwners()
	c.membersMu.Unlock()
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	c := (*Cluster)(e)
	c.membersMu.Lock()
	if _, ok := c.members[n.Name]; ok {
		c.members[n.Name] = copyNode(n)
		c.noteIncarnation(n)
		c.updateOwners()
	}
	c.membersMu.Unlock()
}

// noteIncarnation takes the origin a member announces for its current incarnation: a
// member that came back (restarted) is known for its new self at once, so that what
// its earlier incarnation counted in the window before is not taken for what it may
// hold now (share.go), before it has sent this node anything.
func (c *Cluster) noteIncarnation(n *memberlist.Node) {
	if o := announcedOrigin(n.Name, n.Meta); o != "" && n.Name != c.cfg.NodeName {
		c.slots.sawDirect(o)
	}
}

// copyNode copies a member, with its metadata.
func copyNode(n *memberlist.Node) memberlist.Node {
	cp := *n
	cp.Meta = bytes.Clone(n.Meta)
	return cp
}

// logWriter turns memberlist's log lines into structured logs: errors and warnings at
// their level, the rest at debug.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "use of closed network connection"):
			// memberlist's listeners report their own shutdown as an error.
			w.log.Debug(line, "component", "memberlist")
		case strings.Contains(line, "[ERR]"):
			w.log.Error(strings.TrimSpace(line[strings.Index(line, "[ERR]")+5:]), "component", "memberlist")
		case strings.Contains(line, "[WARN]"):
			w.log.Warn(strings.TrimSpace(line[strings.Index(line, "[WARN]")+6:]), "component", "memberlist")
		default:
			w.log.Debug(line, "component", "memberlist")
		}
	}
	return len(p), nil
}

var _ io.Writer = (*logWriter)(nil)

func splitHostPort(hp string) (string, int, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, errors.New("must be host:port")
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, errors.New("the port must be a number from 0 to 65535")
	}
	if ip := net.ParseIP(host); ip == nil {
		ips, err := net.LookupHost(host)
		if err != nil || len(ips) == 0 {
			return "", 0, fmt.Errorf("cannot resolve %q", host)
		}
		host = ips[0]
	}
	return host, p, nil
}
