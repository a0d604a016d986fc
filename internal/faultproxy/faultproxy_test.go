package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer answers each line with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(c, c)
		}
	}()
	return ln.Addr().String()
}

// TestFreezeThawReset: a frozen link delivers nothing until thawed, then
// everything in order; a reset ends the connection with ECONNRESET and
// the proxy takes new connections after it.
func TestFreezeThawReset(t *testing.T) {
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(line string) (string, error) {
		if _, err := io.WriteString(c, line+"\n"); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	if got, err := roundTrip("one"); err != nil || got != "one\n" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	p.Freeze()
	io.WriteString(c, "two\nthree\n")
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if got, err := r.ReadString('\n'); !errors.Is(err, syscall.ETIMEDOUT) && !isTimeout(err) {
		t.Fatalf("a frozen link delivered %q (%v)", got, err)
	}
	p.Thaw()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range []string{"two\n", "three\n"} {
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("after the thaw: %q, %v; want %q", got, err, want)
		}
	}
	p.Reset()
	if _, err := roundTrip("four"); err == nil {
		t.Fatal("a reset connection still answered")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, "five\n")
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != "five\n" {
		t.Fatalf("a new connection after the reset: %q, %v", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
