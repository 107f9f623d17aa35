# plots/figure.gp: one figure of one or two panels and a key, from the files plots/plots.sh
# wrote into a scratch folder. Every PNG in plots/ is drawn by it:
#   gnuplot -e "term='pngcairo'; dat='/tmp/plots.XXXXXX'" plots/figure.gp
#
# Set on the command line by plots/plots.sh:
#   term        pngcairo or png (whichever this gnuplot has)
#   dat         the scratch folder, which holds:
#     styles.gp   the `set linetype` of every stage (the same look in every figure)
#     vars.gp     out (the PNG), heading (the figure's title, any number of lines: "\n"
#                 breaks it; plots/plots.sh ends it with the line naming its CSVs and their
#                 date), panels (1, 2, or 4: two rows of two, 0 and 1 above 2 and 3),
#                 xkind ('N', the default: x is the sequence length N; 'fraction': x is the
#                 visible fraction of (query, key) pairs, masks.png), and per panel p:
#                   ptitle<p>   panel title
#                   ylabel<p>   y axis label
#                   yformat<p>  tic format of the y axis ('%g'; '%.0b %BB' for bytes)
#                   yfactor<p>  0: y tics at 1, 2, 5 x powers of 10; -1: a linear y axis
#                               (the zoom on the fastest stages); else at powers of this
#                               (32 for bytes: 1 MiB, 32 MiB, 1 GiB; 2 for ratios: 0.5, 1, 2)
#                   nlist<p>    the N values (or fractions) to put x tics at
#     p<p>.gp     panel p: `set label` lines, then its `plot` command (the series, with
#                 notitle: the key is drawn apart)
#     key.gp      the key: a `plot` of NaN elements, one per entry, in order
# x is the sequence length N on a log2 axis (the fraction in masks.png), y a log axis but in
# a panel whose yfactor is -1.

load dat.'/vars.gp'
if (!exists('xkind')) { xkind = 'N' }
cols = (panels == 1) ? 1 : 2
rows = (panels > 2) ? 2 : 1
W = (cols == 2) ? 1600 : 1000
H = 600 + (rows - 1) * 500
if (term eq 'pngcairo') {
    set terminal pngcairo size W, H font 'DejaVu Sans,10' noenhanced
} else {
    set terminal png size W, H noenhanced
}
set output out
load dat.'/styles.gp'

# N tics as 512, 1k, 2k, ... 128k, ... 1M; the range padded so that end points stay inside.
xlab(n) = n < 1024 ? sprintf('%d', n) : n < 1048576 ? sprintf('%dk', n / 1024) : sprintf('%dM', n / 1048576)

KW = (cols == 2) ? 0.19 : 0.26       # width of the key, as a fraction of the figure ...
if (exists('keychars')) {           # ... or wider, for its longest title (~7.5 px a character)
    KW = (keychars * 7.5 + 70) / W > KW ? (keychars * 7.5 + 70) / W : KW
}
PW = (1 - KW) / cols
# the heading's lines ("\n" breaks them) and the room they leave the panels
hlines = 1
hrest = heading
while (strstrt(hrest, "\n") > 0) { hlines = hlines + 1; hrest = hrest[strstrt(hrest, "\n") + 1 :] }
PH = 0.97 - 0.03 * hlines * 600 / H   # the room under the heading, all rows
set multiplot title heading font ',13'
do for [p = 0 : panels - 1] {
    set size PW, PH / rows
    set origin (p % cols) * PW, (rows - 1 - p / cols) * PH / rows
    set grid xtics ytics mytics lc rgb '#dddddd'
    set border 3
    set tics nomirror
    set logscale x 2
    yfactor = value(sprintf('yfactor%d', p))
    if (yfactor > 0) {
        set logscale y 2
        set ytics yfactor ** -4, yfactor
    } else { if (yfactor < 0) {
        unset logscale y
        set ytics autofreq
        set mytics default
    } else {
        set logscale y 10
        set ytics ()
        do for [e = -3 : 6] { set ytics add (10.0 ** e, 2 * 10.0 ** e, 5 * 10.0 ** e) }
    } }
    set format y value(sprintf('yformat%d', p))
    set xlabel (xkind eq 'fraction' ? 'visible fraction of the (query, key) pairs' : 'sequence length N')
    set ylabel value(sprintf('ylabel%d', p))
    set title value(sprintf('ptitle%d', p))
    set autoscale yfix                  # the data's range plus a margin, not whole decades
    set offsets 0, 0, graph 0.05, graph 0.05
    unset key                           # one key for the whole figure, drawn last at the right

    nlist = value(sprintf('nlist%d', p))
    set xtics ()
    if (xkind eq 'fraction') {
        do for [w in nlist] { x = real(w); set xtics add (sprintf('%g', x) x) }
        set xrange [real(word(nlist, 1)) / 1.3 : real(word(nlist, words(nlist))) * 1.3]
    } else {
        do for [w in nlist] { n = int(w); lab = xlab(n); set xtics add (lab n) }
        if (words(nlist) > 0) {
            set xrange [int(word(nlist, 1)) / 1.3 : int(word(nlist, words(nlist))) * 1.3]
        } else {
            set xrange [256 : 32768]
        }
    }
    set yrange [*:*]
    load sprintf('%s/p%d.gp', dat, p)
    unset label
}

# The key: every entry of the figure once, as plots of nothing in an empty frame.
set size KW, PH
set origin 1 - KW, 0
unset border
unset tics
unset grid
unset xlabel
unset ylabel
unset title
unset logscale
set xrange [0 : 1]
set yrange [0 : 1]
set key inside left top vertical Left reverse samplen 3 spacing 1.3
load dat.'/key.gp'
unset multiplot
