-- A 2-layer GIN (Xu et al., "How Powerful are Graph Neural Networks?") over the TU tables
-- graph / node / edge, then a graph readout. Same function as torch_geometric's GINConv with
-- its defaults (eps = 0, not trained) and nn = Linear -> ReLU -> Linear:
--   h_i' = MLP((1 + eps) * h_i + sum over edges j -> i of h_j)
-- Messages flow src -> dst as in the edge table; a repeated edge counts twice and a self loop
-- in the edge table is a neighbour like any other (PyG does not remove them either).
-- The GIN aggregate is one relation of two statements, which relsql sums: the neighbour sum
-- (grouped, only nodes with in-edges) and the root term (one row per node; with eps = 0 its
-- factor 1 + eps is 1). The MLP is applied to that sum in the next relation.

-- node features as a relation: joined by key below, so the plan gathers (or sparsely multiplies)
-- one row per node instead of reading a copy of x for every edge from the database
CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

-- layer 1, aggregate: x_i + sum_{j -> i} x_j over the node features x
CREATE TABLE gin1_agg AS
SELECT e.dst AS node_id, sum(n.h) AS h
FROM edge e
JOIN node_x n ON n.node_id = e.src
GROUP BY e.dst;

CREATE TABLE gin1_agg AS
SELECT n.node_id, n.x AS h
FROM node n;

-- layer 1, MLP x (7) -> 16 -> 16, then ReLU between the layers
CREATE TABLE gin1 AS
SELECT a.node_id,
       relu(linear(relu(linear(a.h, 16, 'gin1_w1') + bias(16, 'gin1_b1')), 16, 'gin1_w2') + bias(16, 'gin1_b2')) AS h
FROM gin1_agg a;

-- layer 2, aggregate
CREATE TABLE gin2_agg AS
SELECT e.dst AS node_id, sum(l.h) AS h
FROM edge e
JOIN gin1 l ON l.node_id = e.src
GROUP BY e.dst;

CREATE TABLE gin2_agg AS
SELECT l.node_id, l.h AS h
FROM gin1 l;

-- layer 2, MLP 16 -> 16 -> 16, no activation (the readout follows)
CREATE TABLE gin2 AS
SELECT a.node_id,
       linear(relu(linear(a.h, 16, 'gin2_w1') + bias(16, 'gin2_b1')), 16, 'gin2_w2') + bias(16, 'gin2_b2') AS h
FROM gin2_agg a;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE gin_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN gin2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE gin_out AS
SELECT p.graph_id, linear(p.h, 2, 'gin_out_w') + bias(2, 'gin_out_b') AS h
FROM gin_pool p;
