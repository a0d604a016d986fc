package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"time"
)

// latencyProxy forwards TCP connections to target, delaying every chunk by
// delay in each direction and keeping its order: a database in another
// zone, simulated on loopback. It serves until ctx ends.
func latencyProxy(ctx context.Context, target string, delay time.Duration) (addr string, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			go delayed(server, client, delay)
			go delayed(client, server, delay)
		}
	}()
	return ln.Addr().String(), nil
}

// delayed copies src to dst, each chunk delay after it was read.
func delayed(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		due  time.Time
		data []byte
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		// One read buffer, and each chunk copied at its size: most are a
		// few hundred bytes, and a fresh 32 KiB per read made the proxy
		// (in the bench's process, on the cores the hosts use) a large
		// share of the machine's CPU.
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{time.Now().Add(delay), append([]byte(nil), buf[:n]...)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// Closing both ends stops the other direction too.
	dst.Close()
	src.Close()
	for range chunks { // let the reader finish
	}
	io.Copy(io.Discard, src)
}

// viaProxy is location (a postgres:// URL) with its host and port replaced
// by addr.
func viaProxy(location, addr string) (string, error) {
	u, err := url.Parse(location)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	u.Host = addr
	return u.String(), nil
}
