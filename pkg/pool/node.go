package pool

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// NodeRecord is written by each node plugin that serves the pool,
// PATH/nodes/<node ID>.json. The controller knows a node only through it.
type NodeRecord struct {
	ID         string    `json:"id"`
	Zone       string    `json:"zone"`
	MaxVolumes int64     `json:"maxVolumes"`
	LastStart  time.Time `json:"lastStart"`
}

// WriteNode records that a node plugin serves this pool.
func (p *Pool) WriteNode(rec NodeRecord) error {
	if err := ValidateNodeID(rec.ID); err != nil {
		return err
	}
	return p.nodes.writeRecord(rec.ID+recordSuffix, rec, maxSmallRecordBytes)
}

// ReadNode reads a node's record; an unknown node wraps ErrNotFound and a node
// ID that could not be a file name wraps ErrInvalidID.
func (p *Pool) ReadNode(id string) (*NodeRecord, error) {
	if err := ValidateNodeID(id); err != nil {
		return nil, err
	}
	var rec NodeRecord
	if err := p.nodes.readRecord(id+recordSuffix, &rec, maxSmallRecordBytes); err != nil {
		return nil, fmt.Errorf("node %s in pool %s: %w", id, p.Name, err)
	}
	if rec.ID != id {
		return nil, fmt.Errorf("node %s in pool %s: record names node %q: %w", id, p.Name, rec.ID, ErrCorrupt)
	}
	return &rec, nil
}

// ListNodes returns the IDs of the nodes that serve the pool, sorted: every
// entry named like a node record, whether or not it can be read.
func (p *Pool) ListNodes() ([]string, error) {
	names, err := p.nodes.names()
	if err != nil {
		return nil, fmt.Errorf("pool %s: list nodes: %w", p.Name, err)
	}
	var ids []string
	for _, name := range names {
		if id, ok := strings.CutSuffix(name, recordSuffix); ok && ValidateNodeID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}
