// Package faultproxy is a TCP proxy that misbehaves on command, for
// benchmarks and fault tests on loopback: it delays every chunk (a
// database in another zone), freezes a link (a partition that drops
// nothing: what is sent waits, and arrives in order once thawed, unless
// an end gives up first), or resets every connection through it.
package faultproxy

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// Proxy forwards connections on its own loopback address to one target.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	delay  time.Duration
	thawed chan struct{} // closed while not frozen
	conns  map[net.Conn]bool
	closed bool
}

// Start listens on a free loopback port and forwards to target
// (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, thawed: make(chan struct{}), conns: map[net.Conn]bool{}}
	close(p.thawed)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Via is location (a URL such as postgres://…) with its host and port
// replaced by the proxy's.
func (p *Proxy) Via(location string) (string, error) {
	u, err := url.Parse(location)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

// SetDelay delays each chunk read from now on by d, in each direction.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Freeze stops delivering anything in either direction, on every
// connection and on new ones, until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default: // frozen already
	}
}

// Thaw delivers what waited, in order, and everything after.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// Reset ends every connection through the proxy with a TCP reset; new
// connections are taken as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a close that sends RST, not FIN
		}
		c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy and ends every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Thaw()
	p.Reset()
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.conns[client], p.conns[server] = true, true
		p.mu.Unlock()
		go p.pipe(server, client)
		go p.pipe(client, server)
	}
}

// state is what a chunk read now waits for: the thaw, then its delay.
func (p *Proxy) state() (<-chan struct{}, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.thawed, p.delay
}

// pipe copies src to dst in order, each chunk after its delay and never
// while the link is frozen.
func (p *Proxy) pipe(dst, src net.Conn) {
	type chunk struct {
		due  time.Time
		data []byte
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		// One read buffer, each chunk copied at its size: most are a few
		// hundred bytes, and a fresh 32 KiB a read made the proxy (in the
		// bench's process, on the hosts' cores) a large share of the CPU.
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				_, delay := p.state()
				chunks <- chunk{time.Now().Add(delay), append([]byte(nil), buf[:n]...)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait)
		}
		thawed, _ := p.state()
		<-thawed
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// Closing both ends stops the other direction too.
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
	for range chunks { // let the reader finish
	}
	io.Copy(io.Discard, src)
}
