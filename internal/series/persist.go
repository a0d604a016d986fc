package series

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Save writes the samples to path (a temporary file beside it, synced,
// renamed over it), so a host started again draws the hour before it.
func (r *Recorder) Save(path string) error {
	r.mu.Lock()
	data, err := json.Marshal(r.samples)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("save the series: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("save the series: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save the series: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save the series: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// Load puts back the samples Save wrote that are within the hour before
// now and older than any held; none saved is not an error.
func (r *Recorder) Load(path string, now time.Time) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load the series: %w", err)
	}
	var saved []Sample
	if err := json.Unmarshal(data, &saved); err != nil {
		return fmt.Errorf("load the series %s: %w", path, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	from, before := now.Unix()-Kept, now.Unix()+1
	if len(r.samples) > 0 {
		before = r.samples[0].T
	}
	var kept []Sample
	for _, s := range saved {
		if s.T > from && s.T < before {
			kept = append(kept, s)
		}
	}
	r.samples = append(kept, r.samples...)
	if len(r.samples) > Kept {
		r.samples = r.samples[len(r.samples)-Kept:]
	}
	return nil
}
