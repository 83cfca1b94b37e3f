package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// reportEvery is how often the load generator reports its counts; the
// harness reads a step's rate from two reports, so they must be fresh.
const reportEvery = 20 * time.Millisecond

// loadgenConfig configures the MQTT load generator child.
type loadgenConfig struct {
	Broker   string `json:"broker"`
	ClientID string `json:"client_id"`
	Clients  int    `json:"clients"` // MQTT connections, each publishing rate/Clients
	Devices  int    `json:"devices"` // devices published round-robin
	QoS      byte   `json:"qos"`
	// Window bounds the publishes of one connection not yet acknowledged
	// by the broker; a full window makes the publisher wait.
	Window int `json:"window"`
}

// loadgenChild publishes signals of cfg.Devices devices over MQTT at the
// rate the harness sets ("rate N" on standard input), and prints
// "sent acked failed" every reportEvery. "stop" (or the end of standard input)
// stops publishing; it then waits for outstanding acks and prints
// "done sent acked failed".
func loadgenChild() error {
	var cfg loadgenConfig
	if err := json.Unmarshal([]byte(os.Getenv(childConfigEnv)), &cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// paho refuses a nil payload; an empty one is a signal.
	empty := []byte{}
	topics := make([]string, cfg.Devices)
	for i := range topics {
		topics[i] = "devices/" + deviceID(i) + "/signal"
	}
	clients := make([]mqtt.Client, cfg.Clients)
	for k := range clients {
		o := mqtt.NewClientOptions().AddBroker(cfg.Broker).SetClientID(fmt.Sprintf("%s-%d", cfg.ClientID, k)).
			SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false).SetWriteTimeout(10 * time.Second).
			SetKeepAlive(30 * time.Second)
		c := mqtt.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return fmt.Errorf("connect %s: %v", cfg.Broker, tok.Error())
		}
		clients[k] = c
	}
	var (
		rate                atomic.Uint64 // float64 bits, signals/s over all clients
		stopped             atomic.Bool
		sent, acked, failed atomic.Int64
		wg                  sync.WaitGroup
		printMu             sync.Mutex
		printCounts         = func(prefix string) {
			printMu.Lock()
			defer printMu.Unlock()
			fmt.Printf("%s%d %d %d\n", prefix, sent.Load(), acked.Load(), failed.Load())
		}
	)
	for k, c := range clients {
		wg.Go(func() {
			var ring []mqtt.Token
			reap := func(block bool) {
				for len(ring) > 0 {
					tok := ring[0]
					if block {
						tok.Wait()
					} else {
						select {
						case <-tok.Done():
						default:
							return
						}
					}
					if tok.Error() != nil {
						failed.Add(1)
					} else {
						acked.Add(1)
					}
					ring = ring[1:]
				}
			}
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			next := k
			last := time.Now()
			var due float64
			for !stopped.Load() {
				now := <-tick.C
				r := math.Float64frombits(rate.Load()) / float64(len(clients))
				due += r * now.Sub(last).Seconds()
				last = now
				// A publisher that fell behind does not burst to catch
				// up by more than 50ms of its rate.
				due = min(due, r*0.05+1)
				for ; due >= 1 && !stopped.Load(); due-- {
					if len(ring) >= cfg.Window {
						tok := ring[0]
						tok.Wait()
						reap(false)
					}
					ring = append(ring, c.Publish(topics[next], cfg.QoS, false, empty))
					sent.Add(1)
					next += len(clients)
					if next >= len(topics) {
						next = k
					}
				}
				reap(false)
				if r == 0 {
					due = 0
				}
			}
			reap(true)
		})
	}
	fmt.Println("ready")
	reporterDone := make(chan struct{})
	stopReporter := make(chan struct{})
	go func() {
		defer close(reporterDone)
		t := time.NewTicker(reportEvery)
		defer t.Stop()
		for {
			select {
			case <-stopReporter:
				return
			case <-t.C:
				printCounts("")
			}
		}
	}()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "rate" {
			v, err := strconv.ParseFloat(f[1], 64)
			if err == nil && v >= 0 {
				rate.Store(math.Float64bits(v))
			}
			continue
		}
		if len(f) == 1 && f[0] == "stop" {
			break
		}
	}
	stopped.Store(true)
	wg.Wait()
	close(stopReporter)
	<-reporterDone
	printCounts("done ")
	for _, c := range clients {
		c.Disconnect(250)
	}
	return nil
}
