package allocator_test

// What the checks of the multi-allocator machine (property_multi_test.go)
// tolerate, in one place.

import (
	"k8s.io/apimachinery/pkg/types"
)

// noteExposed keeps, per pod, the claim whose record held it under its
// current mark. A mark whose claim's record never listed the pod (a
// hand-out whose record write failed or never came) exposed the pod to no
// one: removing it leaves the pod as clean as it was when marked. Every
// record change the allocators make is read here (the interceptor reads
// after each write), so no exposure goes unseen. m.mu held.
func (m *mmMachine) noteExposed(st *mmState) {
	for _, pod := range st.pods {
		if c, ok := m.exposed[pod.uid]; ok && (pod.mark == "" || parseMarkUID(pod.mark) != c) {
			delete(m.exposed, pod.uid)
		}
		if mark, ok := m.recycledUnder[pod.uid]; ok && mark != pod.mark {
			delete(m.recycledUnder, pod.uid)
		}
	}
	for _, c := range st.claims {
		for _, p := range c.held {
			if pod := st.pods[p]; pod != nil && pod.mark == c.mark() {
				m.exposed[pod.uid] = c.uid
			}
		}
	}
}

// noteMayGo adds to mayGo what st shows. m.mu held.
func (m *mmMachine) noteMayGo(st *mmState) {
	for _, c := range st.claims {
		for _, p := range c.release {
			m.mayGo[mmPair{c.uid, p}] = true
		}
		for _, p := range c.held {
			pod := st.pods[p]
			if c.terminating || len(c.held) > c.want || pod == nil || !pod.ready || pod.terminating ||
				m.marks && pod.mark != c.mark() || m.podPool[p] != c.pool {
				m.mayGo[mmPair{c.uid, p}] = true
			}
		}
	}
}

// premark reports whether the claim's record lists a pod written without
// pod marks that no allocator has marked since.
func (m *mmMachine) premark(claim types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for pair := range m.exemptPremark {
		if pair.claim == claim {
			return true
		}
	}
	return false
}
