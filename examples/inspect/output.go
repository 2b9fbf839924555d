package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/poolalloc/poolalloc/syncer"
)

// writeJSON writes rep as indented JSON.
func writeJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// writeTable writes rep for people: a header, the pods, the claims, and
// the problems.
func writeTable(w io.Writer, rep Report) error {
	var b strings.Builder
	if rep.Demo {
		b.WriteString("DEMO: a pool this command set up on an embedded API server, not a cluster of yours.\n")
		b.WriteString("      Set KUBECONFIG to inspect a real pool (-namespace, -pool).\n\n")
	}
	marks := "marks under " + rep.MarkKey
	if rep.MarkKey == "" {
		marks = "marks not checked"
	}
	fmt.Fprintf(&b, "pool %s/%s: %d pods, %d claims; records under %s, %s\n\n",
		rep.Namespace, rep.Pool, countPresent(rep.Pods), len(rep.Claims), rep.RecordKeys.Allocated, marks)

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tSTATE\tHOLDER (RECORD)\tMARK\tPROBLEMS")
	for _, p := range rep.Pods {
		holder := dash(strings.Join(p.Holders, ", "))
		if len(p.ReleaseRequested) > 0 {
			holder += " (release requested by " + strings.Join(p.ReleaseRequested, ", ") + ")"
		}
		if p.HolderUnknown {
			holder = "? (" + p.MarkClaim + "'s record refused)"
		}
		mark := p.MarkClaim
		if mark == "" {
			mark = p.Mark // a mark that names no claim, shown as it is
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.State, holder, dash(mark), kinds(p.Problems))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(rep.Claims) > 0 {
		b.WriteString("\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "CLAIM\tWANT\tHOLDS\tANNOTATIONS\tPROBLEMS")
		for _, c := range rep.Claims {
			want := fmt.Sprint(c.Want)
			if c.Deleting {
				want = "deleting"
			}
			holds := fmt.Sprint(len(c.Held))
			if c.Held == nil { // the record was refused
				holds = "?"
			}
			size := fmt.Sprintf("%d B (%d%%)", c.AnnotationsBytes, c.AnnotationsBytes*100/syncer.MaxAnnotationsSize)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Name, want, holds, size, kinds(c.Problems))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	b.WriteString("\n")
	switch n := len(rep.Problems); n {
	case 0:
		b.WriteString("no problems: every record and mark agree\n")
	default:
		fmt.Fprintf(&b, "%d %s:\n", n, plural(n, "problem", "problems"))
		for _, f := range rep.Problems {
			fmt.Fprintf(&b, "  %s\n", f)
		}
		if slices.ContainsFunc(rep.Problems, func(f Finding) bool { return f.Kind == MarkWithoutRecord }) {
			b.WriteString("(a hand-out or release in flight shows for a moment as mark-without-record: run again to confirm)\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func countPresent(pods []PodReport) int {
	n := 0
	for _, p := range pods {
		if p.State != StateAbsent {
			n++
		}
	}
	return n
}

func kinds(ks []Kind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return dash(strings.Join(s, ", "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
