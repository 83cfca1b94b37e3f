package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP forwarder in front of a server. Hold stops forwarding in
// both directions while connections stay open, as a network stall or a
// frozen peer does: a client's writes wait in the proxy and reach the
// server only at Release, whatever happened meanwhile.
type Proxy struct {
	Addr string // where clients connect

	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond
	held  bool
	seen  []byte // bytes read from clients while held
	conns []net.Conn
	wg    sync.WaitGroup
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

// pipe copies src to dst, waiting while the proxy is held; it closes both
// when either side ends.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.held && fromClient {
				p.seen = append(p.seen, buf[:n]...)
			}
			for p.held {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
