-- A 2-layer relational graph attention network over the TU tables graph / node / edge, one
-- weight matrix per edge label, then a graph readout. Same function as torch_geometric's
-- RGATConv with its defaults (one head, additive self-attention, softmax across relations):
--   h_i' = b + sum_{j -r-> i} alpha_ij W_r h_j,
--   alpha_ij = softmax_j(leaky_relu(q . W_r h_i + k . W_r h_j, 0.2)) over all in-edges of i
-- where r is the edge's label: the destination is also transformed by the edge's matrix.
-- A node without in-edges gets only the bias, as in PyG. W_r h is one typed linear per edge
-- (rows grouped by label); written three times, it is computed once (common subexpressions).

CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

CREATE TABLE rgat1_pre AS
SELECT e.dst AS node_id,
       attention(leaky_relu(linear(linear(d.h, 16, 'rgat1_w', e.label), 1, 'rgat1_q')
                            + linear(linear(s.h, 16, 'rgat1_w', e.label), 1, 'rgat1_k'), 0.2),
                 linear(s.h, 16, 'rgat1_w', e.label)) AS h
FROM edge e
JOIN node_x s ON s.node_id = e.src
JOIN node_x d ON d.node_id = e.dst
GROUP BY e.dst;

CREATE TABLE rgat1_pre AS
SELECT n.node_id, bias(16, 'rgat1_b') AS h
FROM node n;

CREATE TABLE rgat1 AS
SELECT p.node_id, relu(p.h) AS h
FROM rgat1_pre p;

-- layer 2: 16 -> 16, no activation (the readout follows)
CREATE TABLE rgat2 AS
SELECT e.dst AS node_id,
       attention(leaky_relu(linear(linear(d.h, 16, 'rgat2_w', e.label), 1, 'rgat2_q')
                            + linear(linear(s.h, 16, 'rgat2_w', e.label), 1, 'rgat2_k'), 0.2),
                 linear(s.h, 16, 'rgat2_w', e.label)) AS h
FROM edge e
JOIN rgat1 s ON s.node_id = e.src
JOIN rgat1 d ON d.node_id = e.dst
GROUP BY e.dst;

CREATE TABLE rgat2 AS
SELECT n.node_id, bias(16, 'rgat2_b') AS h
FROM node n;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE rgat_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN rgat2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE rgat_out AS
SELECT p.graph_id, linear(p.h, 2, 'rgat_out_w') + bias(2, 'rgat_out_b') AS h
FROM rgat_pool p;
