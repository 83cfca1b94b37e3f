package bench

import (
	"fmt"
	"strings"
)

// rounds is how many times each side of a comparison is measured. Every
// figure keeps each side's best run and its detail gives every run (the
// spread): a noisy neighbour on a shared machine then flatters no side.
const rounds = 3

// alternate runs every side once per round, rounds times, the order
// rotated from one round to the next so that no side always runs first (on
// a warmer, or a busier, machine). round is the round's number, from 0.
func alternate(n int, sides ...func(round int) error) error {
	for round := range n {
		for i := range sides {
			if err := sides[(round+i)%len(sides)](round); err != nil {
				return err
			}
		}
	}
	return nil
}

// runs lists measures for a figure's detail, as "1.2, 1.5, 1.3 ms".
func runs(vs []float64, unit string) string {
	out := make([]string, len(vs))
	for j, v := range vs {
		if v >= 100 {
			out[j] = fmt.Sprintf("%.0f", v)
		} else {
			out[j] = trimFloat(round1(v))
		}
	}
	s := strings.Join(out, ", ")
	if unit != "" {
		s += " " + unit
	}
	return s
}

// bestOf says how a figure's side was chosen, for its detail.
func bestOf(n int) string { return fmt.Sprintf("best of %d, the order alternated", n) }
