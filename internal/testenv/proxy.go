package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP forwarder in front of a server. Hold stops forwarding in
// both directions while connections stay open, as a network stall or a
// frozen peer does: a client's writes wait in the proxy and reach the
// server only at Release, in order, whatever happened meanwhile.
type Proxy struct {
	Addr string // where clients connect

	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	held  bool
	seen  []byte // bytes read from clients while held
	conns []net.Conn
	// refuseUntil: connections accepted before then are closed at once.
	refuseUntil time.Time
	wg          sync.WaitGroup
}

// NewProxy forwards a listener on 127.0.0.1 to target until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.Release()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Hold stops forwarding.
func (p *Proxy) Hold() {
	p.mu.Lock()
	p.held, p.seen = true, nil
	p.mu.Unlock()
}

// Release forwards what was held, then everything as it comes.
func (p *Proxy) Release() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut closes every connection through the proxy, as a network failure
// between client and server does, and refuses new ones for d; the server
// stays up and sees each connection end.
func (p *Proxy) Cut(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseUntil = time.Now().Add(d)
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// HeldContains reports whether clients wrote s while the proxy was held.
func (p *Proxy) HeldContains(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.seen, []byte(s))
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := time.Now().Before(p.refuseUntil)
		p.mu.Unlock()
		if refused {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c, true) })
		p.wg.Go(func() { p.pipe(c, s, false) })
	}
}

// pipe copies src to dst. While the proxy is held it goes on reading src
// and keeps what it read until Release, so that HeldContains sees all a
// client wrote, not only its first write. It closes both when either side
// ends; what is still kept then is dropped, as a cut connection drops it.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	var (
		queue [][]byte // read, not yet written; guarded by p.mu
		ended bool     // src ended; guarded by p.mu
	)
	written := make(chan struct{})
	go func() {
		defer close(written)
		defer src.Close()
		defer dst.Close()
		for {
			p.mu.Lock()
			for !ended && (p.held || len(queue) == 0) {
				p.cond.Wait()
			}
			out := queue
			queue = nil
			if p.held || (ended && len(out) == 0) {
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			for _, b := range out {
				if _, err := dst.Write(b); err != nil {
					return
				}
			}
		}
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		p.mu.Lock()
		if n > 0 {
			if p.held && fromClient {
				p.seen = append(p.seen, buf[:n]...)
			}
			queue = append(queue, buf[:n])
		}
		ended = err != nil
		p.cond.Broadcast()
		p.mu.Unlock()
		if err != nil {
			break
		}
	}
	<-written
}
