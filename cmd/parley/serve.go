package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/parley-im/parley/internal/auth"
	"github.com/parley-im/parley/internal/chat"
	"github.com/parley-im/parley/internal/config"
	"github.com/parley-im/parley/internal/gateway"
	"github.com/parley-im/parley/internal/presence"
	"github.com/parley-im/parley/internal/server"
	"github.com/parley-im/parley/internal/store/cassandra"
)

func runServe(ctx context.Context, args []string) error {
	cfg, err := config.Load(args, os.Environ())
	if err != nil {
		return err
	}
	log := newLogger(cfg.Log)
	if addr := os.Getenv(pprofEnv); addr != "" {
		servePprof(addr, log)
	}
	authCfg, err := cfg.ResolveAuth()
	if err != nil {
		return err
	}
	if cfg.UsesDevKey() {
		log.Warn("using the development token key in the data directory; configure auth.hs256_key_file or auth.ed25519_public_key_file for production", "data_dir", cfg.DataDir)
	}
	srv, err := server.Start(ctx, serverOptions(cfg, authCfg, log))
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "parley: serving on ws://%s/v1/ws (node %s, data %s)\n", srv.Addr(), cfg.NodeID, cfg.DataDir)
	<-ctx.Done()
	log.Info("stopping: draining connections", "timeout", cfg.Gateway.DrainTimeout)
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Gateway.DrainTimeout+5*time.Second)
	defer cancel()
	srv.Drain(stopCtx)
	return srv.Shutdown(stopCtx)
}

func serverOptions(cfg config.Config, authCfg auth.Config, log *slog.Logger) server.Options {
	g := cfg.Gateway
	ch := chat.DefaultConfig()
	ch.Limits = cfg.Limits.Protocol()
	ch.SnapshotRangeLimit = cfg.Chat.SnapshotRangeLimit
	ch.SnapshotLatest = cfg.Chat.SnapshotLatest
	ch.RecallWindow = cfg.Chat.RecallWindow
	ch.ReadScope = cfg.Chat.ReadScope
	ch.SmallBelow = cfg.Chat.SmallBelow
	ch.LargeAbove = cfg.Chat.LargeAbove
	ch.Hysteresis = cfg.Chat.Hysteresis
	ch.EveryoneInterval = cfg.Chat.EveryoneInterval
	ch.TypingInterval = cfg.Chat.TypingInterval
	gw := gateway.DefaultConfig()
	gw.Node = cfg.NodeID
	gw.Limits = cfg.Limits.Protocol()
	gw.HeartbeatInterval = g.HeartbeatInterval
	gw.IdleTimeout = g.IdleTimeout
	gw.RetransmitAfter = g.RetransmitAfter
	gw.RetransmitMax = g.RetransmitMax
	gw.MaxInflight = g.MaxInflight
	gw.DrainTimeout = g.DrainTimeout
	gw.MaxConnections = g.MaxConnections
	gw.HandshakeRate = g.HandshakeRate
	gw.HandshakeBurst = g.HandshakeBurst
	gw.SyncRate = g.SyncRate
	gw.SyncBurst = g.SyncBurst
	gw.OutboundQueueBytes = g.OutboundQueueBytes
	gw.MaxHeaderBytes = g.MaxHeaderBytes
	gw.HeaderTimeout = g.HeaderTimeout
	gw.BodyTimeout = g.BodyTimeout
	gw.MaxPendingConnections = g.MaxPendingConnections
	gw.UserSendRate = g.UserSendRate
	gw.UserSendBurst = g.UserSendBurst
	gw.ConnRequestRate = g.ConnRequestRate
	gw.ConnRequestBurst = g.ConnRequestBurst
	gw.MaxSessionsPerUser = g.MaxSessionsPerUser
	gw.MaxPollSessionsPerUser = g.MaxPollSessionsPerUser
	gw.UserHandshakeRate = g.UserHandshakeRate
	gw.UserHandshakeBurst = g.UserHandshakeBurst
	roles := cfg.RoleSet()
	o := server.Options{
		Listen: cfg.Listen, DataDir: cfg.DataDir, Node: cfg.NodeID, Auth: authCfg,
		RunGateway: roles[config.RoleGateway], RunChat: roles[config.RoleChat],
		Gateway: gw, Chat: ch, BucketWidth: cfg.Chat.BucketWidth,
		Presence: presence.Config{Flush: cfg.Chat.PresenceFlush, MinGap: cfg.Chat.PresenceMinGap},
		Logger:   log,
		Web: server.Web{
			Page:        cfg.Web.Page,
			CORSOrigins: server.ParseOrigins(cfg.Web.CORSOrigins),
			WSOrigins:   server.ParseOrigins(cfg.Web.WSOrigins),
		},
	}
	if cfg.UsesDevKey() {
		// Only the development key enables POST /v1/dev/token.
		o.Web.DevKey = authCfg.HS256Key
	}
	if cfg.Cluster.Enabled() {
		o.Cluster = &server.Cluster{
			Redis: cfg.Cluster.Redis, NATS: cfg.Cluster.NATS, Cassandra: cassandraConfig(cfg),
			Namespace: cfg.Cluster.Namespace, JetStreamReplicas: cfg.Cluster.JetStreamReplicas,
		}
	}
	return o
}

func cassandraConfig(cfg config.Config) cassandra.Config {
	var hosts []string
	for _, h := range strings.Split(cfg.Cluster.CassandraHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return cassandra.Config{
		Hosts: hosts, Keyspace: cfg.Cluster.Keyspace, Consistency: cfg.Cluster.Consistency,
		SerialConsistency: cfg.Cluster.SerialConsistency,
		ReplicationFactor: cfg.Cluster.ReplicationFactor, BucketWidth: cfg.Chat.BucketWidth,
	}
}

func newLogger(l config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if l.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
