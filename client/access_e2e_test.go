package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parley-im/parley/internal/servertest"
	"github.com/parley-im/parley/protocol"
	"github.com/parley-im/parley/token"
)

// The operator's close codes (docs/protocol.md): 4001 token expired and
// 4002 token revoked reconnect with a new token and stop when none comes;
// 4003 banned stops at once; 4004 disconnected reconnects with backoff.
// Each runs against a real server with its admin API; a proxy counts the
// client's dials.

// adminPost calls srv's server API and fails the test unless it answers 200.
func adminPost(t *testing.T, srv *servertest.Server, path, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.AdminURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+srv.AdminKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d", path, resp.StatusCode)
	}
}

// mint is a token of user issued at iat, valid for an hour after it.
func mint(t *testing.T, srv *servertest.Server, user string, iat time.Time) string {
	t.Helper()
	tok, err := token.MintHS256(srv.Key(), token.Claims{User: user, IssuedAt: iat, Expires: iat.Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// runErr waits for Run's error.
func runErr(t *testing.T, rc *runningClient) error {
	t.Helper()
	select {
	case err := <-rc.errc:
		return err
	case <-time.After(waitLimit):
		t.Fatal("Run did not stop")
		return nil
	}
}

func TestE2EBannedStops(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	for _, withFunc := range []bool{false, true} {
		t.Run(fmt.Sprint("token func ", withFunc), func(t *testing.T) {
			user := fmt.Sprint("banned-", withFunc)
			px := newProxy(t, srv.URL)
			var asked atomic.Int32
			rc := startE2E(t, px.url(), srv.Token(user), "d1", func(c *Config) {
				if withFunc {
					c.Token, c.TokenFunc = "", func(context.Context) (string, error) {
						asked.Add(1)
						return mint(t, srv, user, time.Now()), nil
					}
				}
			})
			adminPost(t, srv, "/v1/admin/users/"+user+"/ban", `{}`)
			err := runErr(t, rc)
			if !errors.Is(err, ErrBanned) {
				t.Fatalf("Run = %v, want ErrBanned", err)
			}
			<-rc.rec.done
			if evs, _ := rc.rec.all(EventDisconnected); len(evs) != 1 || !errors.Is(evs[0].Err, ErrBanned) {
				t.Fatalf("disconnect events %+v, want one with ErrBanned", evs)
			}
			if n := len(px.dials()); n != 1 {
				t.Fatalf("%d dials, want 1: a banned client never reconnects", n)
			}
			if withFunc && asked.Load() != 1 {
				t.Fatalf("TokenFunc asked %d times, want 1", asked.Load())
			}
			// A client that starts banned stops at the handshake.
			late := launch(t, testConfig(t, srv.URL, srv.Token(user), "d2"), false)
			if err := runErr(t, late); !errors.Is(err, ErrBanned) || CodeOf(err) != protocol.CodeBanned {
				t.Fatalf("Run of a banned user's new client = %v, want ErrBanned", err)
			}
		})
	}
}

func TestE2ERevokedToken(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	old := time.Now().Add(-time.Hour)
	revoke := func(user string) {
		adminPost(t, srv, "/v1/admin/users/"+user+"/revoke", fmt.Sprintf(`{"before":%d}`, time.Now().Add(-30*time.Minute).UnixMilli()))
	}

	t.Run("fixed token stops", func(t *testing.T) {
		px := newProxy(t, srv.URL)
		rc := startE2E(t, px.url(), mint(t, srv, "rv1", old), "d1", nil)
		revoke("rv1")
		err := runErr(t, rc)
		if !errors.Is(err, ErrTokenRevoked) || !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Run = %v, want ErrTokenRevoked and ErrUnauthorized", err)
		}
		<-rc.rec.done
		if evs, _ := rc.rec.all(EventDisconnected); len(evs) != 1 || !errors.Is(evs[0].Err, ErrTokenRevoked) {
			t.Fatalf("disconnect events %+v, want one with ErrTokenRevoked", evs)
		}
		if n := len(px.dials()); n != 1 {
			t.Fatalf("%d dials, want 1: a revoked fixed token is never sent again", n)
		}
	})

	t.Run("token func renews", func(t *testing.T) {
		px := newProxy(t, srv.URL)
		var asked atomic.Int32
		rc := startE2E(t, px.url(), "", "d1", func(c *Config) {
			c.Token, c.TokenFunc = "", func(context.Context) (string, error) {
				if asked.Add(1) == 1 {
					return mint(t, srv, "rv2", old), nil
				}
				return mint(t, srv, "rv2", time.Now()), nil
			}
		})
		revoke("rv2")
		eventually(t, "reconnected with a new token", func() bool { return rc.rec.count(EventConnected) == 2 })
		if evs, _ := rc.rec.all(EventDisconnected); len(evs) != 1 || !errors.Is(evs[0].Err, ErrTokenRevoked) {
			t.Fatalf("disconnect events %+v, want one with ErrTokenRevoked", evs)
		}
		if n := len(px.dials()); n != 2 || asked.Load() != 2 {
			t.Fatalf("%d dials, TokenFunc asked %d times; want 2 and 2", n, asked.Load())
		}
		if _, err := rc.Send(ctxT(t), mustDirect(t, rc, "rv2-peer"), "still here"); err != nil {
			t.Fatalf("send after the renewal: %v", err)
		}
	})

	t.Run("token func with the same token stops", func(t *testing.T) {
		px := newProxy(t, srv.URL)
		tok := mint(t, srv, "rv3", old)
		rc := startE2E(t, px.url(), "", "d1", func(c *Config) {
			c.Token, c.TokenFunc = "", func(context.Context) (string, error) { return tok, nil }
		})
		revoke("rv3")
		err := runErr(t, rc)
		if !errors.Is(err, ErrTokenRevoked) || !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("Run = %v, want ErrTokenRevoked and ErrUnauthorized", err)
		}
		if n := len(px.dials()); n != 1 {
			t.Fatalf("%d dials, want 1: the same revoked token is never sent again", n)
		}
	})
}

// mustDirect opens rc's direct conversation with peer.
func mustDirect(t *testing.T, rc *runningClient, peer string) uint64 {
	t.Helper()
	conv, err := rc.OpenDirect(ctxT(t), peer)
	if err != nil {
		t.Fatal(err)
	}
	return conv.ConvID
}

func TestE2EExpiredFixedTokenStops(t *testing.T) {
	srv := servertest.Start(t)
	px := newProxy(t, srv.URL)
	now := time.Now()
	tok, err := token.MintHS256(srv.Key(), token.Claims{User: "ex1", IssuedAt: now, Expires: now.Add(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	rc := startE2E(t, px.url(), tok, "d1", nil)
	err = runErr(t, rc)
	if !errors.Is(err, ErrTokenExpired) || !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("Run = %v, want ErrTokenExpired and ErrUnauthorized", err)
	}
	if n := len(px.dials()); n != 1 {
		t.Fatalf("%d dials, want 1: an expired fixed token is never sent again", n)
	}
}

func TestE2EOperatorDisconnectReconnects(t *testing.T) {
	srv := servertest.Start(t, servertest.WithAdmin())
	px := newProxy(t, srv.URL)
	rc := startE2E(t, px.url(), srv.Token("kicked"), "d1", nil)
	adminPost(t, srv, "/v1/admin/users/kicked/disconnect", `{"device":"d1"}`)
	eventually(t, "reconnected", func() bool { return rc.rec.count(EventConnected) == 2 })
	if evs, _ := rc.rec.all(EventDisconnected); len(evs) != 1 || !errors.Is(evs[0].Err, ErrKicked) {
		t.Fatalf("disconnect events %+v, want one with ErrKicked", evs)
	}
	if n := len(px.dials()); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
}
