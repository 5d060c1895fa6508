-- Mutagenesis: the relational architecture of Neumann's thesis "Scaling Up Deep Relational
-- Learning" (NeuraLogic's molecules/mutagenesis/templates/template.txt + embeddings.txt),
-- written over the keyed tables of relsql.datasets.mutagenesis (molecule, atom, bond):
--   atom embedding per element, bond embedding per bond type,
--   3 message-passing layers  l_k(X) = tanh(avg over bonds (X,Y,B) of
--                                       tanh(W_self l_{k-1}(X) + W_nb l_{k-1}(Y) + bond(B))),
--   readout  predict(M) = linear(avg over the atoms of M of l3), one logit per molecule.
-- NeuraLogic's 3-wide vectors become WIDTH-wide ones (WIDTH = 16 here: change every `16` to
-- resize); its tanh on `predict` is left out, the output is a logit for BCE-with-logits.
-- The bond table has one row per undirected bond, so each layer walks it in both directions
-- (a UNION ALL in the FROM subquery): every atom receives one message per incident bond.

-- atom embedding: one learnable vector per element (NeuraLogic: {3,1} atom_embed(A) :- c(A).)
CREATE TABLE atom_embed AS
SELECT a.atom_id, tanh(embed(a.element, 16, 'atom_embed')) AS h
FROM atom a;

-- bond embedding: one learnable vector per bond type (NeuraLogic: {3,1} bond_embed(B) :- b_1(B).)
CREATE TABLE bond_embed AS
SELECT b.bond_id, tanh(embed(b.bond_type, 16, 'bond_embed')) AS h
FROM bond b;

-- layer 1: each atom averages, over its bonds, tanh(W_self x + W_nb y + bond embedding)
CREATE TABLE l1_embed AS
SELECT n.atom_id,
       tanh(avg(tanh(linear(x.h, 16, 'l1_self') + linear(y.h, 16, 'l1_nb') + e.h))) AS h
FROM (
    SELECT atom1_id AS atom_id, atom2_id AS neighbour_id, bond_id FROM bond
    UNION ALL
    SELECT atom2_id AS atom_id, atom1_id AS neighbour_id, bond_id FROM bond
) n
JOIN atom_embed x ON x.atom_id = n.atom_id
JOIN atom_embed y ON y.atom_id = n.neighbour_id
JOIN bond_embed e ON e.bond_id = n.bond_id
GROUP BY n.atom_id;

-- layer 2: the same rule over layer 1, with its own weights
CREATE TABLE l2_embed AS
SELECT n.atom_id,
       tanh(avg(tanh(linear(x.h, 16, 'l2_self') + linear(y.h, 16, 'l2_nb') + e.h))) AS h
FROM (
    SELECT atom1_id AS atom_id, atom2_id AS neighbour_id, bond_id FROM bond
    UNION ALL
    SELECT atom2_id AS atom_id, atom1_id AS neighbour_id, bond_id FROM bond
) n
JOIN l1_embed x ON x.atom_id = n.atom_id
JOIN l1_embed y ON y.atom_id = n.neighbour_id
JOIN bond_embed e ON e.bond_id = n.bond_id
GROUP BY n.atom_id;

-- layer 3: the same rule over layer 2, with its own weights
CREATE TABLE l3_embed AS
SELECT n.atom_id,
       tanh(avg(tanh(linear(x.h, 16, 'l3_self') + linear(y.h, 16, 'l3_nb') + e.h))) AS h
FROM (
    SELECT atom1_id AS atom_id, atom2_id AS neighbour_id, bond_id FROM bond
    UNION ALL
    SELECT atom2_id AS atom_id, atom1_id AS neighbour_id, bond_id FROM bond
) n
JOIN l2_embed x ON x.atom_id = n.atom_id
JOIN l2_embed y ON y.atom_id = n.neighbour_id
JOIN bond_embed e ON e.bond_id = n.bond_id
GROUP BY n.atom_id;

-- readout: average of l3 over the molecule's atoms, then one logit per molecule
CREATE TABLE predict AS
SELECT a.molecule_id, linear(avg(l.h), 1, 'predict') + bias(1, 'predict_bias') AS h
FROM atom a
JOIN l3_embed l ON l.atom_id = a.atom_id
GROUP BY a.molecule_id;
