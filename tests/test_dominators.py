"""Retained sizes from the dominator tree, checked against the definition on random graphs:
remove a node and weigh what the root no longer reaches."""

from hypothesis import given, settings
from hypothesis import strategies as st

from harness._attribution.dominators import UNREACHED, immediate_dominators, retained


@st.composite
def graphs(draw):
    size = draw(st.integers(1, 14))
    nodes = st.integers(0, size - 1)
    edges = draw(st.lists(st.tuples(nodes, nodes), max_size=4 * size))
    successors = [[] for _ in range(size)]
    for a, b in edges:
        successors[a].append(b)
    weights = draw(st.lists(st.integers(0, 1000), min_size=size, max_size=size))
    return successors, weights


def reached(successors, removed=None):
    seen, stack = {0}, [0]
    while stack:
        for b in successors[stack.pop()]:
            if b not in seen and b != removed:
                seen.add(b)
                stack.append(b)
    return seen


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_retained_sizes_are_what_removing_a_node_frees(graph):
    successors, weights = graph
    idom = immediate_dominators(successors)
    kept = retained(idom, weights)
    alive = reached(successors)
    for node in range(len(successors)):
        if node not in alive:
            assert idom[node] == UNREACHED
            continue
        freed = alive - reached(successors, removed=node) if node else alive
        assert kept[node] == sum(weights[n] for n in freed | {node})


def test_a_shared_child_belongs_to_neither_parent():
    # 0 -> 1 -> 3, 0 -> 2 -> 3: node 3 is dominated by the root alone
    idom = immediate_dominators([[1, 2], [3], [3], []])
    assert idom == [0, 0, 0, 0]
    assert retained(idom, [0, 1, 1, 10]) == [12, 1, 1, 10]


def test_a_cycle_kept_by_one_entry_is_retained_by_it():
    # 0 -> 1 -> 2 -> 3 -> 2
    idom = immediate_dominators([[1], [2], [3], [2]])
    assert idom == [0, 0, 1, 2]
    assert retained(idom, [0, 5, 7, 11])[1] == 23
