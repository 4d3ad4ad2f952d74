package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// maxWidth is the widest line a table may print: it fits a terminal of
// 100 columns, and a wider cell is cut (-o json has every value whole).
const maxWidth = 100

// tone is the colour of a cell on a terminal.
type tone int

const (
	plain tone = iota
	good
	bad
	warn
)

// ansi are the colour sequences of each tone; reset ends one.
var ansi = map[tone]string{good: "\x1b[32m", bad: "\x1b[31m", warn: "\x1b[33m"}

const reset = "\x1b[0m"

// cell is one table cell: its text, a tone, and the most runes it may
// take (0: no limit).
type cell struct {
	text  string
	tone  tone
	limit int
}

// c is a plain cell.
func c(s string) cell { return cell{text: s} }

// cut is a plain cell of at most limit runes.
func cut(s string, limit int) cell { return cell{text: s, limit: limit} }

// table is a table of cells. It aligns columns by the text alone and
// colours after padding, so colour never moves a column (text/tabwriter
// would count the escape sequences as width).
type table struct {
	header []string
	rows   [][]cell
}

func (t *table) add(cells ...cell) { t.rows = append(t.rows, cells) }

// write prints the table, colouring when color is set; columns are two
// spaces apart and the last column is not padded.
func (t *table) write(w io.Writer, color bool) {
	rows := make([][]cell, 0, len(t.rows)+1)
	head := make([]cell, len(t.header))
	for i, h := range t.header {
		head[i] = c(h)
	}
	rows = append(rows, head)
	rows = append(rows, t.rows...)
	var widths []int
	for _, r := range rows {
		for i := range r {
			r[i].text = truncate(r[i].text, r[i].limit)
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(r[i].text))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		b.Reset()
		for i, cl := range r {
			if i > 0 {
				b.WriteString("  ")
			}
			if color && cl.tone != plain {
				b.WriteString(ansi[cl.tone] + cl.text + reset)
			} else {
				b.WriteString(cl.text)
			}
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cl.text)))
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

// truncate cuts s to limit runes, the last one an ellipsis (0: no limit).
func truncate(s string, limit int) string {
	if limit <= 0 || utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	return string(r[:limit-1]) + "…"
}

// paint colours s when color is set.
func paint(s string, t tone, color bool) string {
	if !color || t == plain {
		return s
	}
	return ansi[t] + s + reset
}

// printObject prints v as JSON or YAML as the --output format says and
// reports whether it did; "" prints nothing (the command prints tables).
func printObject(w io.Writer, format string, v any) (bool, error) {
	switch format {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintln(w, string(b))
		return true, err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}

// bytesIEC prints n bytes in binary units, as Kubernetes quantities read:
// "512Mi", "1.5Gi", "20Gi".
func bytesIEC(n int64) string {
	const units = "KMGTPE"
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d", n)
	}
	v, u := float64(n), -1
	for (v >= 1024 || v <= -1024) && u < len(units)-1 {
		v /= 1024
		u++
	}
	s := fmt.Sprintf("%.1f", v)
	if v >= 10 || v <= -10 || strings.HasSuffix(s, ".0") {
		s = fmt.Sprintf("%.0f", v)
	}
	return s + string(units[u]) + "i"
}

// age prints a duration as kubectl's AGE column does, coarsely: "42s", "5m", "3h", "2d".
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// yesNo prints b as "yes" or "no".
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// orDash is s, or "-" when s is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
