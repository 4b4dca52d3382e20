//go:build linux

package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	gorilla "github.com/gorilla/websocket"
)

// maxClientConns keeps one client process under the 20,000 open-file limit.
const maxClientConns = 18000

func runClients(args []string) error {
	fs := flag.NewFlagSet("clients", flag.ContinueOnError)
	url := fs.String("url", "ws://127.0.0.1:18080/ws", "server URL")
	n := fs.Int("n", 0, "connections to open at start")
	src := fs.String("src", "127.0.0.2", "local source IP for every connection")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ip := net.ParseIP(*src)
	if ip == nil {
		return fmt.Errorf("clients: bad -src %q", *src)
	}
	nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
	d := &gorilla.Dialer{NetDialContext: nd.DialContext, ReadBufferSize: 256, WriteBufferSize: 256}
	var conns []*gorilla.Conn // held so that finalizers never close idle sockets
	add := func(k int) error {
		if len(conns)+k > maxClientConns {
			return fmt.Errorf("clients: %d connections exceed the per-process cap %d", len(conns)+k, maxClientConns)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var firstErr error
		sem := make(chan struct{}, 16) // bounded concurrent handshakes
		for range k {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				c, err := dialOne(d, *url)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					conns = append(conns, c)
				} else if firstErr == nil {
					firstErr = err
				}
			})
		}
		wg.Wait()
		if firstErr != nil {
			return fmt.Errorf("clients: %d open: %w", len(conns), firstErr)
		}
		_, err := fmt.Printf("ready %d\n", len(conns))
		return err
	}
	if err := add(*n); err != nil {
		return err
	}
	// measure grows the pool over stdin ("add K"); standalone runs just hold.
	for sc := bufio.NewScanner(os.Stdin); sc.Scan(); {
		var k int
		if _, err := fmt.Sscanf(sc.Text(), "add %d", &k); err != nil {
			return fmt.Errorf("clients: bad command %q: %w", sc.Text(), err)
		}
		if err := add(k); err != nil {
			return err
		}
	}
	select {}
}

// dialOne sends one small text frame and waits for its echo, so that every
// counted connection is upgraded and registered server-side.
func dialOne(d *gorilla.Dialer, url string) (*gorilla.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, _, err := d.DialContext(ctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	if err = c.WriteMessage(gorilla.TextMessage, []byte(`{"t":"hello"}`)); err == nil {
		_, _, err = c.ReadMessage()
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("hello/echo: %w", err)
	}
	return c, c.SetReadDeadline(time.Time{})
}
